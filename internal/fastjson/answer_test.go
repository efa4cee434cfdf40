package fastjson

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// renderStrings need every kind of escape json.Marshal writes.
var renderStrings = []string{
	"", "req-1", "gpt-4o", `a"b\c`, "<script>&amp;</script>", "tab\there\nnl\r\b\f\x00\x1f\x7f",
	"é😀", "\u2028\u2029", "bad \xff utf-8 \xe2\x80", "\xed\xa0\x80", "ok/slash",
}

// renderTimes include what MarshalJSON refuses.
var renderTimes = []time.Time{
	time.Date(2026, 11, 30, 10, 0, 0, 123456000, time.UTC),
	time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
	time.Date(2026, 11, 30, 10, 0, 0, 1, time.FixedZone("", -(3*3600+30*60))),
	time.Date(2026, 11, 30, 10, 0, 0, 0, time.FixedZone("", 14*3600+30*60+15)),
	time.Date(2026, 11, 30, 10, 0, 0, 0, time.FixedZone("", 25*3600)),
	time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	{},
}

func randomLog(r *rand.Rand, depth int) overage.UsageLog {
	pick := func() string { return renderStrings[r.IntN(len(renderStrings))] }
	ptr := func() *string {
		if r.IntN(3) == 0 {
			return nil
		}
		s := pick()
		return &s
	}
	tm := func() time.Time {
		if r.IntN(4) > 0 {
			return renderTimes[r.IntN(3)]
		}
		return renderTimes[r.IntN(len(renderTimes))]
	}
	tptr := func() *time.Time {
		if r.IntN(2) == 0 {
			return nil
		}
		t := tm()
		return &t
	}
	id := func() uuid.UUID {
		var u uuid.UUID
		for i := range u {
			u[i] = byte(r.IntN(256))
		}
		return u
	}
	n := func() int64 { return r.Int64N(1<<41) - 1<<20 }
	l := overage.UsageLog{
		ID: id(), TenantID: id(), RequestID: ptr(), Timestamp: tm(), UserID: pick(), ModelID: pick(),
		InputTokens: n(), OutputTokens: n(), Overage: overage.Overage{InputTokens: n(), OutputTokens: n()},
		BillingStatus: overage.BillingStatus(pick()), BilledAt: tptr(), CreatedAt: tm(),
		FirstAttemptAt: tptr(), BillingMessage: ptr(), Kind: overage.Kind(pick()), Reason: ptr(), CorrectedBy: ptr(),
	}
	for range r.IntN(3) {
		l.StripeEvents = append(l.StripeEvents, overage.StripeEvent{Dimension: overage.Dimension(pick()), Identifier: ptr(), Value: n(), AcceptedAt: tptr()})
	}
	if r.IntN(3) == 0 {
		l.StripeEvents = []overage.StripeEvent{} // empty, not nil: omitted too
	}
	if r.IntN(2) == 0 {
		c := id()
		l.Corrects = &c
	}
	if r.IntN(2) == 0 {
		l.CorrectedTotals = &overage.Overage{InputTokens: n(), OutputTokens: n()}
	}
	if depth == 0 {
		for range r.IntN(3) {
			l.Corrections = append(l.Corrections, randomLog(r, depth+1))
		}
	}
	return l
}

// TestRenderMatchesJSONMarshal: the hand-written answers are json.Marshal's
// bytes, and refuse what json.Marshal refuses.
func TestRenderMatchesJSONMarshal(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		l := randomLog(r, 0)
		single := LogAnswer{UsageLog: &l, Duplicate: r.IntN(2) == 0}
		want, err := json.Marshal(single)
		got, ok := RenderLog(&single)
		checkRendered(t, got, ok, want, err)

		resp := BatchAnswer{Events: []BatchEvent{{Index: 0, Duplicate: single.Duplicate, UsageLog: &l}}}
		for i := range r.IntN(4) {
			o := randomLog(r, 0)
			resp.Events = append(resp.Events, BatchEvent{Index: i + 1, Duplicate: r.IntN(2) == 0, UsageLog: &o})
		}
		for _, e := range resp.Events {
			if e.Duplicate {
				resp.Duplicates++
			} else {
				resp.Created++
			}
		}
		want, err = json.Marshal(resp)
		got, ok = RenderBatch(&resp)
		checkRendered(t, got, ok, want, err)
	}
}

// FuzzRenderString: any string is written as json.Marshal writes it.
func FuzzRenderString(f *testing.F) {
	for _, s := range renderStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, json.Marshal %s", s, got, want)
		}
	})
}

func checkRendered(t *testing.T, got []byte, ok bool, want []byte, err error) {
	t.Helper()
	switch {
	case err != nil && ok:
		t.Fatalf("json.Marshal refuses (%v), the writer gives %s", err, got)
	case err == nil && !ok:
		t.Fatalf("json.Marshal gives %s, the writer refuses", want)
	case err == nil && !bytes.Equal(got, want):
		t.Fatalf("writer:\n%s\njson.Marshal:\n%s", got, want)
	}
}

// TestRenderKnowsEveryField fills every field of a usage log by reflection,
// so a field added to overage.UsageLog (or StripeEvent, Overage) that the
// hand-written renderer does not write fails here, rather than going
// unnoticed because randomLog does not set it.
func TestRenderKnowsEveryField(t *testing.T) {
	t.Parallel()
	var l overage.UsageLog
	fillEveryField(reflect.ValueOf(&l).Elem(), 0)
	want, err := json.Marshal(&l)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := appendUsageLog(nil, &l)
	if !ok || !bytes.Equal(got, want) {
		t.Fatalf("the hand-written usage log differs from json.Marshal's:\n got %s\nwant %s", got, want)
	}
}

// fillEveryField sets v, and everything it holds, to a value other than
// its zero; slices get one element, and nesting stops at depth 2.
func fillEveryField(v reflect.Value, depth int) {
	switch v.Interface().(type) {
	case time.Time:
		v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 10, 0, 0, 123, time.UTC)))
		return
	case uuid.UUID:
		v.Set(reflect.ValueOf(uuid.MustParse("0198f3a2-0000-7000-8000-000000000001")))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillEveryField(v.Field(i), depth)
			}
		}
	case reflect.Pointer:
		if depth < 2 {
			v.Set(reflect.New(v.Type().Elem()))
			fillEveryField(v.Elem(), depth+1)
		}
	case reflect.Slice:
		if depth < 2 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			fillEveryField(v.Index(0), depth+1)
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(7)
	case reflect.Bool:
		v.SetBool(true)
	default:
		panic("fillEveryField: add kind " + v.Kind().String())
	}
}
