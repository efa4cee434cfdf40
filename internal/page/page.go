// Package page reads and writes the pagination of list endpoints: a
// bounded page size (?limit=) and an opaque cursor (?cursor=) that names
// the last item of the previous page, so a page is a range scan of an
// index, however deep, and items added meanwhile are neither skipped nor
// repeated.
package page

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strconv"

	"github.com/overage-billing/overage"
)

const (
	// DefaultLimit is the page size without ?limit=.
	DefaultLimit = 100
	// MaxLimit is the largest ?limit= accepted.
	MaxLimit = 1000
	// maxCursorLen bounds what is decoded: every cursor of ours is far
	// shorter.
	maxCursorLen = 1024
)

// Params are a list request's page: at most Limit items after the one the
// cursor names (none: from the start).
type Params struct {
	Limit  int
	cursor []byte
}

// First is the first page of the default size.
func First() Params { return Params{Limit: DefaultLimit} }

// HasCursor reports whether the request continues a previous page.
func (p Params) HasCursor() bool { return p.cursor != nil }

// Parse reads ?limit= and ?cursor=; a malformed one is EMALFORMED naming it.
func Parse(q url.Values) (Params, error) {
	p := Params{Limit: DefaultLimit}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > MaxLimit {
			return p, malformed("limit", "must be an integer from 1 to "+strconv.Itoa(MaxLimit))
		}
		p.Limit = n
	}
	if q.Has("cursor") {
		c := q.Get("cursor")
		b, err := base64.RawURLEncoding.DecodeString(c)
		if c == "" || len(c) > maxCursorLen || err != nil || !json.Valid(b) {
			return p, errBadCursor()
		}
		p.cursor = b
	}
	return p, nil
}

// Cursor decodes the cursor into v, the key type of the list; a cursor of
// another shape is EMALFORMED.
func (p Params) Cursor(v any) error {
	// Only what Next wrote: it must read back and write again byte for
	// byte, so another list's cursor, or an edited one, is refused rather
	// than read as the start.
	dec := json.NewDecoder(bytes.NewReader(p.cursor))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errBadCursor()
	}
	if again, err := json.Marshal(v); err != nil || !bytes.Equal(again, p.cursor) {
		return errBadCursor()
	}
	return nil
}

func errBadCursor() error {
	return malformed("cursor", "must be the next_cursor of a previous page of this list, unchanged")
}

// Next is the next_cursor of a page: the key of its last item when more
// may follow, else nil (JSON null).
func Next(more bool, last any) *string {
	if !more {
		return nil
	}
	b, err := json.Marshal(last)
	if err != nil {
		// The keys are ids, names and times; they always marshal.
		panic("page: cursor key does not marshal: " + err.Error())
	}
	s := base64.RawURLEncoding.EncodeToString(b)
	return &s
}

func malformed(field, detail string) error {
	e := overage.Errorf(overage.EMALFORMED, "malformed-request", "%s %s", field, detail)
	e.Fields = []overage.FieldError{{Field: field, Detail: detail}}
	return e
}
