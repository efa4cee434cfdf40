package fastjson

import (
	"bytes"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// canonicalOnePass is the RFC 8785 form of data built in one pass over the
// bytes, checking what I-JSON forbids on the way, where the decoder path
// (canonicalViaDecoder) walks a body three times. It answers ok only for a
// body it fully understood; anything it does not (a syntax error, a
// duplicate name, a lone surrogate, a number out of range, deep nesting)
// goes to canonicalViaDecoder, so every refusal and its wording are the
// decoder path's.
func canonicalOnePass(data []byte) (canon []byte, ok bool) {
	if !utf8.Valid(data) {
		return nil, false
	}
	p := onePass{data: data, s: string(data), out: make([]byte, 0, len(data))}
	p.space()
	if !p.value(0) {
		return nil, false
	}
	p.space()
	if p.i != len(data) {
		return nil, false
	}
	return p.out, true
}

// maxOnePassDepth bounds the recursion; deeper bodies take the decoder path,
// which has its own limit.
const maxOnePassDepth = 256

type onePass struct {
	data []byte
	// s holds the same bytes, so a name without escapes is a slice of it
	// rather than an allocation.
	s   string
	i   int
	out []byte
	// members is a stack of the members of the objects being read, and
	// scratch the copy of an object's values while they are reordered:
	// both reused, so an object costs no allocation once they have grown.
	members []member
	scratch []byte
}

func (p *onePass) space() { p.i = skipSpace(p.data, p.i) }

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value appends the canonical form of the value at p.i.
func (p *onePass) value(depth int) bool {
	if p.i >= len(p.data) || depth > maxOnePassDepth {
		return false
	}
	switch c := p.data[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, ok := p.str()
		if ok {
			p.out = appendCanonicalString(p.out, s)
		}
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	}
	return false
}

func (p *onePass) literal(lit string) bool {
	if !bytes.HasPrefix(p.data[p.i:], []byte(lit)) {
		return false
	}
	p.i += len(lit)
	p.out = append(p.out, lit...)
	return true
}

func (p *onePass) array(depth int) bool {
	p.i++ // '['
	p.out = append(p.out, '[')
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		p.out = append(p.out, ']')
		return true
	}
	for {
		p.space()
		if !p.value(depth + 1) {
			return false
		}
		p.space()
		if p.i >= len(p.data) {
			return false
		}
		switch p.data[p.i] {
		case ',':
			p.i++
			p.out = append(p.out, ',')
		case ']':
			p.i++
			p.out = append(p.out, ']')
			return true
		default:
			return false
		}
	}
}

// member is one name and the canonical form of its value, which lies in
// onePass.out from start to end until the members are sorted.
type member struct {
	name       string
	start, end int
}

func (p *onePass) object(depth int) bool {
	p.i++ // '{'
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		p.out = append(p.out, "{}"...)
		return true
	}
	// Values are written after base as they come, then moved into name
	// order.
	base := len(p.out)
	first := len(p.members)
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return false
		}
		name, ok := p.str()
		if !ok {
			return false
		}
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return false
		}
		p.i++
		p.space()
		start := len(p.out)
		if !p.value(depth + 1) {
			return false
		}
		p.members = append(p.members, member{name: name, start: start, end: len(p.out)})
		p.space()
		if p.i >= len(p.data) {
			return false
		}
		if p.data[p.i] == ',' {
			p.i++
			continue
		}
		if p.data[p.i] != '}' {
			return false
		}
		p.i++
		break
	}
	// Nested objects were read, and their members popped, before this
	// one's end.
	members := p.members[first:]
	if !slices.IsSortedFunc(members, compareMembers) {
		slices.SortFunc(members, compareMembers)
	}
	for k := 1; k < len(members); k++ {
		if members[k].name == members[k-1].name {
			return false // a duplicate name: the decoder path says so
		}
	}
	p.scratch = append(p.scratch[:0], p.out[base:]...)
	values := p.scratch
	p.out = append(p.out[:base], '{')
	for k, m := range members {
		if k > 0 {
			p.out = append(p.out, ',')
		}
		p.out = appendCanonicalString(p.out, m.name)
		p.out = append(p.out, ':')
		p.out = append(p.out, values[m.start-base:m.end-base]...)
	}
	p.out = append(p.out, '}')
	p.members = p.members[:first]
	return true
}

// str decodes the string at p.i. Raw control characters, bad escapes and
// surrogates that do not pair are left to the decoder path.
func (p *onePass) str() (string, bool) {
	p.i++ // '"'
	start := p.i
	// The common case: no escape, so the string is the bytes themselves.
	for p.i < len(p.data) {
		c := p.data[p.i]
		if c == '"' {
			s := p.s[start:p.i]
			p.i++
			return s, true
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", false
		}
		p.i++
	}
	buf := append([]byte(nil), p.data[start:p.i]...)
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return string(buf), true
		case c < 0x20:
			return "", false
		case c != '\\':
			buf = append(buf, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.data) {
			return "", false
		}
		esc := p.data[p.i+1]
		p.i += 2
		switch esc {
		case '"', '\\', '/':
			buf = append(buf, esc)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := p.hex()
			if !ok {
				return "", false
			}
			if utf16.IsSurrogate(r) {
				if r >= 0xdc00 || p.i+1 >= len(p.data) || p.data[p.i] != '\\' || p.data[p.i+1] != 'u' {
					return "", false
				}
				p.i += 2
				lo, ok := p.hex()
				if !ok {
					return "", false
				}
				r = utf16.DecodeRune(r, lo)
				if r == utf8.RuneError {
					return "", false
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", false
		}
	}
	return "", false
}

// hex reads the four hexadecimal digits of a \u escape.
func (p *onePass) hex() (rune, bool) {
	if p.i+4 > len(p.data) {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// number checks the JSON number grammar and appends the number as
// ECMAScript prints it.
func (p *onePass) number() bool {
	start := p.i
	d := p.data
	if d[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(d) && d[p.i] >= '0' && d[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	intStart := p.i
	switch {
	case p.i < len(d) && d[p.i] == '0':
		p.i++
	case digits() == 0:
		return false
	}
	// An integer of up to 15 digits is exactly a float64, which ECMAScript
	// prints as those digits: the common case needs no conversion.
	if p.i-intStart <= 15 && (p.i >= len(d) || (d[p.i] != '.' && d[p.i] != 'e' && d[p.i] != 'E')) {
		if p.s[start:p.i] == "-0" {
			p.out = append(p.out, '0')
		} else {
			p.out = append(p.out, d[start:p.i]...)
		}
		return true
	}
	if p.i < len(d) && d[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return false
		}
	}
	if p.i < len(d) && (d[p.i] == 'e' || d[p.i] == 'E') {
		p.i++
		if p.i < len(d) && (d[p.i] == '+' || d[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return false
		}
	}
	f, err := strconv.ParseFloat(p.s[start:p.i], 64)
	if err != nil {
		return false
	}
	p.out = append(p.out, es6Number(f)...)
	return true
}

func compareMembers(a, b member) int { return compareUTF16(a.name, b.name) }

// compareUTF16 orders names by UTF-16 code units, as RFC 8785 sorts them.
// Below U+E000 that is the order of the UTF-8 bytes.
func compareUTF16(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < 0xee && b[i] < 0xee {
				return int(a[i]) - int(b[i])
			}
			return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		}
	}
	return len(a) - len(b)
}

// appendCanonicalString is writeCanonicalString for a byte slice.
func appendCanonicalString(b []byte, s string) []byte {
	b = append(b, '"')
	// Most strings need no escape: copied at once up to the first that
	// does.
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' {
		i++
	}
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			b = append(b, `\"`...)
		case c == '\\':
			b = append(b, `\\`...)
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, `\b`...)
		case c == '\f':
			b = append(b, `\f`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '\r':
			b = append(b, `\r`...)
		case c == '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		}
	}
	return append(b, '"')
}
