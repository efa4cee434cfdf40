package tenants_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/tenants"
)

func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	var e *overage.Error
	if !errors.As(err, &e) || e.Code != overage.EINVALID {
		t.Fatalf("%v, want validation-failed", err)
	}
	var out []string
	for _, f := range e.Fields {
		out = append(out, f.Field)
	}
	return out
}

// TestIncludedPerMeter: a tenant's allowance per meter key, given as
// "included" or by the old fields, read back the same by Show, List and
// Get; a key must name a meter, N >= 0; an update replaces only the keys
// it names, 0 removing one.
func TestIncludedPerMeter(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	ms := meters.NewStore(pool, "in", "out")
	for _, key := range []string{"gpt4o_in", "cache_reads", "old_meter"} {
		if _, err := ms.Create(ctx, meters.CreateParams{Key: key, EventName: key, TokenType: overage.TokenCacheRead, Models: []string{key}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ms.Archive(ctx, "old_meter"); err != nil {
		t.Fatal(err)
	}
	s := tenants.NewStore(pool)

	c, err := s.Create(ctx, tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_acme", IncludedOutputTokens: 20,
		Included: map[string]int64{"input": 100, "gpt4o_in": 5000, "cache_reads": 0}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"input": 100, "output": 20, "gpt4o_in": 5000}
	if !maps.Equal(c.Included, want) || c.IncludedInputTokens != 100 || c.IncludedOutputTokens != 20 {
		t.Fatalf("created: included %v, input %d, output %d; want %v", c.Included, c.IncludedInputTokens, c.IncludedOutputTokens, want)
	}
	var stored map[string]int64
	var in, out int64
	if err := pool.QueryRow(ctx, `SELECT included_meters, included_input_tokens, included_output_tokens FROM tenants WHERE id = $1`, c.ID).
		Scan(&stored, &in, &out); err != nil {
		t.Fatal(err)
	}
	// The defaults stay in their columns, which ingest reads; a 0 is not
	// stored.
	if !maps.Equal(stored, map[string]int64{"gpt4o_in": 5000}) || in != 100 || out != 20 {
		t.Fatalf("stored included_meters %v, columns %d/%d", stored, in, out)
	}
	d, err := s.Show(ctx, c.ID)
	if err != nil || !maps.Equal(d.Included, want) {
		t.Fatalf("Show: %v (%v), want %v", d.Included, err, want)
	}
	l, err := s.List(ctx)
	if err != nil || len(l.Tenants) != 1 || !maps.Equal(l.Tenants[0].Included, want) {
		t.Fatalf("List: %+v (%v)", l, err)
	}
	g, err := s.Get(ctx, c.ID)
	if err != nil || !maps.Equal(g.Included, want) {
		t.Fatalf("Get: %+v (%v)", g, err)
	}
	b, _ := json.Marshal(d)
	var shown struct {
		Included map[string]int64 `json:"included"`
		In       int64            `json:"included_input_tokens"`
	}
	if err := json.Unmarshal(b, &shown); err != nil || !maps.Equal(shown.Included, want) || shown.In != 100 {
		t.Fatalf("the JSON: %s", b)
	}

	// An update names some keys: the others stay.
	d, err = s.Update(ctx, c.ID, tenants.UpdateParams{Included: map[string]int64{"cache_reads": 7, "output": 30}})
	want = map[string]int64{"input": 100, "output": 30, "gpt4o_in": 5000, "cache_reads": 7}
	if err != nil || !maps.Equal(d.Included, want) || d.IncludedOutputTokens != 30 {
		t.Fatalf("update: %v (%v), want %v", d.Included, err, want)
	}
	// 0 removes a key; the old fields still work, beside "included".
	in500 := int64(500)
	d, err = s.Update(ctx, c.ID, tenants.UpdateParams{IncludedInputTokens: &in500, Included: map[string]int64{"gpt4o_in": 0}})
	want = map[string]int64{"input": 500, "output": 30, "cache_reads": 7}
	if err != nil || !maps.Equal(d.Included, want) {
		t.Fatalf("update: %v (%v), want %v", d.Included, err, want)
	}
	if err := pool.QueryRow(ctx, `SELECT included_meters FROM tenants WHERE id = $1`, c.ID).Scan(&stored); err != nil ||
		!maps.Equal(stored, map[string]int64{"cache_reads": 7}) {
		t.Fatalf("stored included_meters %v (%v)", stored, err)
	}
	// An archived meter still exists: an allowance on it is accepted.
	if _, err := s.Update(ctx, c.ID, tenants.UpdateParams{Included: map[string]int64{"old_meter": 1}}); err != nil {
		t.Fatalf("allowance on an archived meter: %v", err)
	}

	// Refusals name included.<key>, and change nothing.
	before, _ := s.Show(ctx, c.ID)
	for _, tc := range []struct {
		name   string
		p      tenants.UpdateParams
		fields []string
	}{
		{"unknown meters", tenants.UpdateParams{Included: map[string]int64{"nope": 1, "cache_reads": 9, "also_nope": 0}},
			[]string{"included.also_nope", "included.nope"}},
		{"negative", tenants.UpdateParams{Included: map[string]int64{"cache_reads": -1, "input": -2}},
			[]string{"included.cache_reads", "included.input"}},
		{"not a key", tenants.UpdateParams{Included: map[string]int64{"Bad Key": 1}}, []string{"included.Bad Key"}},
		{"alias disagrees", tenants.UpdateParams{IncludedInputTokens: &in500, Included: map[string]int64{"input": 1}}, []string{"included.input"}},
		{"a NUL in the name", tenants.UpdateParams{Name: ptr("a\x00b")}, []string{"name"}},
		{"empty included is nothing to change", tenants.UpdateParams{Included: map[string]int64{}}, []string{"body"}},
	} {
		_, err := s.Update(ctx, c.ID, tc.p)
		if got := fieldsOf(t, err); !slices.Equal(got, tc.fields) {
			t.Errorf("%s: fields %v, want %v", tc.name, got, tc.fields)
		}
	}
	after, _ := s.Show(ctx, c.ID)
	if !maps.Equal(before.Included, after.Included) {
		t.Fatalf("a refused update changed included from %v to %v", before.Included, after.Included)
	}

	for _, tc := range []struct {
		name   string
		p      tenants.CreateParams
		fields []string
	}{
		{"a NUL in the name", tenants.CreateParams{Name: "a\x00", StripeCustomerID: "cus_x"}, []string{"name"}},
		{"unknown meter", tenants.CreateParams{Name: "x", StripeCustomerID: "cus_x", Included: map[string]int64{"nope": 1}}, []string{"included.nope"}},
		{"negative", tenants.CreateParams{Name: "x", StripeCustomerID: "cus_x", Included: map[string]int64{"output": -1}}, []string{"included.output"}},
		{"alias disagrees", tenants.CreateParams{Name: "x", StripeCustomerID: "cus_x", IncludedInputTokens: 5, Included: map[string]int64{"input": 6}},
			[]string{"included.input"}},
	} {
		_, err := s.Create(ctx, tc.p)
		if got := fieldsOf(t, err); !slices.Equal(got, tc.fields) {
			t.Errorf("create, %s: fields %v, want %v", tc.name, got, tc.fields)
		}
	}
	if l, _ := s.List(ctx); len(l.Tenants) != 1 {
		t.Fatalf("%d tenants after refused creates, want 1", len(l.Tenants))
	}
	// The old fields alone, as before.
	old, err := s.Create(ctx, tenants.CreateParams{Name: "old", StripeCustomerID: "cus_old", IncludedInputTokens: 3, IncludedOutputTokens: 4})
	if err != nil || !maps.Equal(old.Included, map[string]int64{"input": 3, "output": 4}) {
		t.Fatalf("create with the old fields: %v (%v)", old.Included, err)
	}
}

func ptr[T any](v T) *T { return &v }
