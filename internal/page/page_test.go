package page_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/internal/page"
)

type key struct {
	At time.Time `json:"c"`
	ID uuid.UUID `json:"i"`
}

func TestCursorRoundTripsAndRefusesOthers(t *testing.T) {
	t.Parallel()
	want := key{At: time.Date(2026, 12, 1, 9, 0, 0, 123456000, time.UTC), ID: uuid.New()}
	next := page.Next(true, want)
	if next == nil || page.Next(false, want) != nil {
		t.Fatalf("Next: %v", next)
	}
	p, err := page.Parse(url.Values{"cursor": {*next}, "limit": {"7"}})
	if err != nil || p.Limit != 7 || !p.HasCursor() {
		t.Fatalf("Parse: %+v, %v", p, err)
	}
	var got key
	if err := p.Cursor(&got); err != nil || !got.At.Equal(want.At) || got.ID != want.ID {
		t.Fatalf("Cursor: %+v, %v; want %+v", got, err, want)
	}
	if p, err := page.Parse(url.Values{}); err != nil || p.Limit != page.DefaultLimit || p.HasCursor() {
		t.Errorf("no parameters: %+v, %v", p, err)
	}
	for _, q := range []url.Values{
		{"limit": {"0"}}, {"limit": {"1001"}}, {"limit": {"ten"}}, {"limit": {""}},
		{"cursor": {""}}, {"cursor": {"!!"}}, {"cursor": {"abc"}},
	} {
		if _, err := page.Parse(q); err == nil {
			t.Errorf("%v accepted", q)
		}
	}
	// Valid JSON, but not this list's key, or edited: refused.
	other := page.Next(true, map[string]int{"n": 5})
	edited := page.Next(true, map[string]any{"c": want.At, "i": want.ID, "x": 1})
	for _, c := range []*string{other, edited} {
		p, err := page.Parse(url.Values{"cursor": {*c}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Cursor(&key{}); err == nil {
			t.Errorf("cursor %s read as a key", *c)
		}
	}
}
