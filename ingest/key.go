package ingest

import (
	"net/http"
	"strings"

	"github.com/overage-billing/overage"
)

const maxKeyLen = 255

// parseIdempotencyKey accepts a key sent bare (abc) or as a structured-field
// string ("abc", draft-ietf-httpapi-idempotency-key-header); both name the
// same key. The key is 1-255 printable ASCII characters.
func parseIdempotencyKey(h http.Header) (string, error) {
	vals := h.Values("Idempotency-Key")
	if len(vals) == 0 {
		return "", keyError("the Idempotency-Key header is required")
	}
	if len(vals) > 1 {
		return "", keyError("send exactly one Idempotency-Key header")
	}
	v := strings.TrimSpace(vals[0])
	if strings.HasPrefix(v, `"`) {
		unq, ok := unquoteSFString(v)
		if !ok {
			return "", keyError(`Idempotency-Key starts with a quote but is not a valid structured-field string ("..." with \" and \\ escapes)`)
		}
		v = unq
	}
	if len(v) == 0 || len(v) > maxKeyLen {
		return "", keyError("Idempotency-Key must be 1 to 255 characters")
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", keyError("Idempotency-Key must be printable ASCII")
		}
	}
	return v, nil
}

// unquoteSFString decodes an RFC 8941 sf-string.
func unquoteSFString(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	inner := s[1 : len(s)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", false
			}
			b.WriteByte(inner[i])
		case c == '"':
			return "", false
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

func keyError(msg string) error {
	e := overage.Errorf(overage.EMALFORMED, "idempotency-key-invalid", "%s", msg)
	e.Fields = []overage.FieldError{{Field: "Idempotency-Key", Detail: msg}}
	return e
}
