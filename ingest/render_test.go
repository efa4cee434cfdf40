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
