package fastjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Canonical returns the JSON Canonicalization Scheme (RFC 8785) form of
// a JSON text: object members sorted by UTF-16 code units, no whitespace,
// numbers as ECMAScript prints them, strings with minimal escaping.
//
// Like RFC 8785 it accepts only I-JSON (RFC 7493): Go's decoder would
// otherwise keep the last of two duplicate keys and turn invalid UTF-8 and
// lone surrogates into U+FFFD, so two different bodies would get one
// canonical form and one fingerprint.
func Canonical(data []byte) ([]byte, error) {
	if canon, ok := canonicalOnePass(data); ok {
		return canon, nil
	}
	return canonicalViaDecoder(data)
}

// canonicalViaDecoder is Canonical through encoding/json: the
// reference canonicalOnePass is fuzzed against, and the path that words
// every refusal.
func canonicalViaDecoder(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonicalize: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("canonicalize: trailing data after the JSON value")
	}
	if err := checkIJSON(data); err != nil {
		return nil, fmt.Errorf("canonicalize: %w", err)
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case string:
		writeCanonicalString(b, v)
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return fmt.Errorf("canonicalize number %s: %w", v, err)
		}
		b.WriteString(es6Number(f))
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, c string) int {
			return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(c)))
		})
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonicalString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("canonicalize: unexpected %T", v)
	}
	return nil
}

func writeCanonicalString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// es6Number formats f as ECMAScript's Number.prototype.toString does.
func es6Number(f float64) string {
	if f == 0 {
		return "0"
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	if f >= 1e-6 && f < 1e21 {
		return sign + strconv.FormatFloat(f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(s, "e")
	expSign, digits := exp[:1], strings.TrimLeft(exp[1:], "0")
	return sign + mant + "e" + expSign + digits
}

// checkIJSON refuses what I-JSON forbids and Go's decoder lets through:
// invalid UTF-8, escaped lone surrogates, and duplicate member names. data
// is already known to be one valid JSON value.
func checkIJSON(data []byte) error {
	if !utf8.Valid(data) {
		return errors.New("the body is not valid UTF-8")
	}
	// Outside strings a valid JSON text has no backslash, so every
	// backslash starts an escape.
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++
		if data[i] != 'u' {
			continue
		}
		r := hex4(data[i+1 : i+5])
		i += 4
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00 && i+6 < len(data) && data[i+1] == '\\' && data[i+2] == 'u' &&
			utf16.DecodeRune(r, hex4(data[i+3:i+7])) != utf8.RuneError:
			i += 6 // a high surrogate and its low surrogate: one character
		case utf16.IsSurrogate(r):
			return fmt.Errorf(`a string holds the lone surrogate \u%04x`, r)
		}
	}
	return checkDuplicateNames(json.NewDecoder(bytes.NewReader(data)))
}

// hex4 decodes four hexadecimal digits already validated by the decoder.
func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(n)
}

// checkDuplicateNames walks the tokens of one JSON value and fails on an
// object naming a member twice.
func checkDuplicateNames(dec *json.Decoder) error {
	var stack []*nameFrame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *nameFrame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.names != nil && top.expectKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				valueEnded(stack)
				continue
			}
			name := tok.(string)
			if top.names[name] {
				return fmt.Errorf("the member %q appears twice in one object", name)
			}
			top.names[name] = true
			top.expectKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &nameFrame{names: map[string]bool{}, expectKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &nameFrame{})
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		valueEnded(stack)
	}
}

// nameFrame is one open object or array of checkDuplicateNames.
type nameFrame struct {
	names     map[string]bool // nil for an array
	expectKey bool
}

// valueEnded notes that a member's value ended: its object now expects the
// next name.
func valueEnded(stack []*nameFrame) {
	if len(stack) > 0 && stack[len(stack)-1].names != nil {
		stack[len(stack)-1].expectKey = true
	}
}
