package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/flakyproxy"
)

// The stream helper numbers checkpoints, keys them <request_id>:<n>,
// retries a lost answer under the same key (recorded once), and the final
// usage may lower a total; nothing is accepted after it.
func TestStreamHelper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL, flakyproxy.None, flakyproxy.DropAfterCommit)
	s, err := b.client(t, proxy.URL).Stream("chatcmpl-stream", "u", "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first, err := s.Checkpoint(ctx, 100, 10)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Checkpoint(ctx, 250, 40) // its first answer is lost
	if err != nil {
		t.Fatal(err)
	}
	if first.Key != "chatcmpl-stream:0" || second.Key != "chatcmpl-stream:1" || !second.Replayed ||
		second.Log == nil || second.Log.InputTokens != 150 || second.Stream.InputTokens != 250 {
		t.Fatalf("checkpoints %+v then %+v", first, second)
	}
	// The retry may be the client's or net/http's own (it resends a
	// request carrying an Idempotency-Key on a reused connection): either
	// way the same key and body.
	seen := fp.Seen()
	if len(seen) != 3 || seen[1].Key != seen[2].Key || seen[1].Body != seen[2].Body {
		t.Fatalf("the retry of the lost answer changed the request: %+v", seen)
	}
	final, err := s.Final(ctx, 240, 45)
	if err != nil {
		t.Fatal(err)
	}
	if final.Log == nil || final.Log.OutputTokens != 5 || final.Correction == nil || final.Correction.InputTokens != -10 || !final.Stream.Closed {
		t.Fatalf("final %+v", final)
	}
	_, err = s.Checkpoint(ctx, 300, 50)
	var e *client.Error
	if !errors.As(err, &e) || e.Type != client.ProblemStreamClosed || e.Attempts != 1 {
		t.Fatalf("a checkpoint after the final one: %v", err)
	}
	var logs int
	if err := b.srv.Pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE stream_request_id = 'chatcmpl-stream'`).Scan(&logs); err != nil || logs != 4 {
		t.Fatalf("%d logs (%v), want 4: two increases, the final's increase and its correction", logs, err)
	}
}
