package api_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/apitest"
)

// pagesAgree is the check of a case that asked path for pages of limit
// items: following next_cursor from that first page lists the same items,
// in the same order, as one page of the default size, each page at most
// limit items and the last without a cursor. bearer is the credential. items names the array of
// the answer, id the field that identifies an item.
func pagesAgree(path string, bearer func(*fixture) string, items, id string, limit int) func(t *testing.T, f *fixture, r *result) {
	return func(t *testing.T, f *fixture, r *result) {
		t.Helper()
		ids := func(m map[string]any) []string {
			var out []string
			for _, it := range m[items].([]any) {
				out = append(out, fmt.Sprint(it.(map[string]any)[id]))
			}
			return out
		}
		whole, err := f.send(context.Background(), get(path, bearer(f)))
		if err != nil || whole.status != 200 {
			t.Fatalf("GET %s: %v %+v", path, err, whole)
		}
		want := ids(whole.json(t))
		if whole.json(t)["next_cursor"] != nil || len(want) <= limit {
			t.Fatalf("GET %s lists %d items on one page (next_cursor %v): the case needs more than %d", path, len(want), whole.json(t)["next_cursor"], limit)
		}
		var got []string
		m := r.json(t)
		for pages := 1; ; pages++ {
			if n := len(m[items].([]any)); n > limit || n == 0 {
				t.Fatalf("page %d holds %d items, want 1 to %d", pages, n, limit)
			}
			got = append(got, ids(m)...)
			next, ok := m["next_cursor"].(string)
			if !ok {
				break
			}
			if pages > len(want) {
				t.Fatalf("more pages than items: %v", got)
			}
			sep := "?"
			if strings.Contains(path, "?") {
				sep = "&"
			}
			res, err := f.send(context.Background(), get(fmt.Sprintf("%s%slimit=%d&cursor=%s", path, sep, limit, url.QueryEscape(next)), bearer(f)))
			if err != nil || res.status != 200 {
				t.Fatalf("page %d: %v %+v", pages+1, err, res)
			}
			m = res.json(t)
		}
		if !slices.Equal(got, want) {
			t.Errorf("the pages list %v, one page lists %v", got, want)
		}
	}
}

func adminBearer(*fixture) string { return apitest.AdminToken }
