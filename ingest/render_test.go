package ingest

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/internal/fastjson"
)

// TestRenderSingleAndBatchMatchJSONMarshal covers renderSingle and
// renderBatch as the service calls them: fastjson's writer, with
// json.Marshal where it declines (internal/fastjson tests the writer
// itself against json.Marshal on random logs).
func TestRenderSingleAndBatchMatchJSONMarshal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)
	tenant := uuid.New()
	events, err := parseBatch(benchBatchBody(5), now, tenant)
	if err != nil {
		t.Fatal(err)
	}
	results := benchResults(tenant, events, now)
	results[1].duplicate = true
	// A time json.Marshal refuses: both paths fail.
	bad := *results[2].log
	bad.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, l := range append([]*result{&results[0], &results[1]}, &result{log: &bad}) {
		for _, dup := range []bool{false, true} {
			out, err := renderSingle([]result{{log: l.log, duplicate: dup}})
			want, wantErr := json.Marshal(fastjson.LogAnswer{UsageLog: l.log, Duplicate: dup})
			if (err != nil) != (wantErr != nil) || (err == nil && !bytes.Equal(out.Body, want)) {
				t.Fatalf("renderSingle: %v %s\njson.Marshal: %v %s", err, out.Body, wantErr, want)
			}
		}
	}
	out, err := renderBatch(results)
	if err != nil {
		t.Fatal(err)
	}
	resp := fastjson.BatchAnswer{Created: len(results) - 1, Duplicates: 1}
	for i, r := range results {
		resp.Events = append(resp.Events, fastjson.BatchEvent{Index: i, Duplicate: r.duplicate, UsageLog: r.log})
	}
	if want, err := json.Marshal(resp); err != nil || !bytes.Equal(out.Body, want) {
		t.Fatalf("renderBatch:\n%s\njson.Marshal:\n%s %v", out.Body, want, err)
	}
	if _, err := renderBatch(append(results, result{log: &bad})); err == nil {
		t.Fatal("renderBatch wrote a time json.Marshal refuses")
	}
}

// TestBatchAnswersReuseReleasedBuffers: a batch answer released once
// written lends its buffer to a later answer, which is still exactly
// json.Marshal's; an answer not released is never written over.
func TestBatchAnswersReuseReleasedBuffers(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)
	tenant := uuid.New()
	marshal := func(results []result) []byte {
		resp := fastjson.BatchAnswer{Created: len(results)}
		for i, r := range results {
			resp.Events = append(resp.Events, fastjson.BatchEvent{Index: i, UsageLog: r.log})
		}
		b, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	batch := func(n int) []result {
		events, err := parseBatch(benchBatchBody(n), now, tenant)
		if err != nil {
			t.Fatal(err)
		}
		return benchResults(tenant, events, now)
	}
	big, small := batch(40), batch(3)
	kept, err := renderBatch(big)
	if err != nil {
		t.Fatal(err)
	}
	keptWant := marshal(big)
	reused := 0
	for i := range 20 {
		out, err := renderBatch(big)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Body, keptWant) {
			t.Fatalf("answer %d of 40 logs differs from json.Marshal's", i)
		}
		first := &out.Body[:1][0]
		out.release()
		out.release() // a second release gives nothing back twice
		next, err := renderBatch(small)
		if err != nil {
			t.Fatal(err)
		}
		if &next.Body[:1][0] == first {
			reused++
		}
		if !bytes.Equal(next.Body, marshal(small)) {
			t.Fatalf("answer %d of 3 logs on a released buffer:\n%s\nwant\n%s", i, next.Body, marshal(small))
		}
		next.release()
	}
	// sync.Pool may drop what it is given (the race detector makes it drop
	// a quarter on purpose), never all of 20.
	if reused == 0 {
		t.Fatal("no answer reused a released buffer")
	}
	if !bytes.Equal(kept.Body, keptWant) {
		t.Fatal("an answer not released was written over")
	}
}
