package client_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/flakyproxy"
)

func adminClient(t *testing.T, baseURL string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{BaseURL: baseURL, APIKey: apitest.AdminToken, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestMeterCalls: CreateMeter, ListMeters and ArchiveMeter against the
// real server with the admin token; refusals are *Error with the problem
// type, not retried.
func TestMeterCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := adminClient(t, b.srv.URL)
	ctx := context.Background()

	ms, err := c.ListMeters(ctx)
	if err != nil || len(ms) != 2 || ms[0].Key != "input" || ms[1].Key != "output" || ms[0].EventName == "" {
		t.Fatalf("ListMeters = %+v, %v; want the defaults", ms, err)
	}
	m, err := c.CreateMeter(ctx, client.MeterParams{Key: "gpt4o_input", EventName: "gpt4o_in", TokenType: "input", Models: []string{"gpt-4o"}})
	if err != nil || m.Key != "gpt4o_input" || !slices.Equal(m.Models, []string{"gpt-4o"}) || m.ArchivedAt != nil || m.CreatedAt.IsZero() {
		t.Fatalf("CreateMeter = %+v, %v", m, err)
	}
	all, err := c.CreateMeter(ctx, client.MeterParams{Key: "reads", EventName: "reads", TokenType: "cache_read"})
	if err != nil || !slices.Equal(all.Models, []string{"*"}) {
		t.Fatalf("CreateMeter without models = %+v, %v", all, err)
	}

	_, err = c.CreateMeter(ctx, client.MeterParams{Key: "again", EventName: "x", TokenType: "input", Models: []string{"gpt-4o"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || apiErr.Type != client.ProblemMeterExists || apiErr.Attempts != 1 {
		t.Fatalf("the same pattern twice: %v, want one 409 meter-exists", err)
	}
	_, err = c.CreateMeter(ctx, client.MeterParams{Key: "Bad", EventName: "x", TokenType: "tokens"})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity || len(apiErr.Fields) != 2 {
		t.Fatalf("bad fields: %v (%+v), want 422 naming key and token_type", err, apiErr)
	}

	a, err := c.ArchiveMeter(ctx, "gpt4o_input")
	if err != nil || a.ArchivedAt == nil {
		t.Fatalf("ArchiveMeter = %+v, %v", a, err)
	}
	if again, err := c.ArchiveMeter(ctx, "gpt4o_input"); err != nil || !again.ArchivedAt.Equal(*a.ArchivedAt) {
		t.Fatalf("ArchiveMeter again = %+v, %v", again, err)
	}
	if _, err := c.ArchiveMeter(ctx, "input"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity {
		t.Fatalf("archive a default: %v, want 422", err)
	}
	if _, err := c.ArchiveMeter(ctx, "no such/meter"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("archive unknown: %v, want 404", err)
	}
	if ms, err = c.ListMeters(ctx); err != nil || len(ms) != 4 {
		t.Fatalf("ListMeters = %+v, %v", ms, err)
	}

	// A tenant's key is not the admin token.
	tc := b.client(t, b.srv.URL)
	if _, err := tc.ListMeters(ctx); !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
		t.Fatalf("ListMeters with a tenant key: %v, want 401", err)
	}
}

// TestCreateMeterLostAnswer: the first attempt creates the meter and its
// answer is lost; the retry is answered 409, and CreateMeter returns the
// meter it created rather than a conflict. A 503 is retried.
func TestCreateMeterLostAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	proxy, fp := newFaultProxy(t, b.srv.URL, flakyproxy.DropAfterCommit, flakyproxy.Unavailable)
	c := adminClient(t, proxy.URL)
	m, err := c.CreateMeter(ctx, client.MeterParams{Key: "lost", EventName: "lost_answer", TokenType: "output", Models: []string{"o3-*"}})
	if err != nil || m.Key != "lost" || m.EventName != "lost_answer" {
		t.Fatalf("CreateMeter through a lost answer = %+v, %v", m, err)
	}
	// The lost one, the 503, the 409, the list.
	if n := len(fp.Seen()); n != 4 {
		t.Fatalf("%d requests reached the proxy, want 4", n)
	}
	var n int
	if err := b.srv.Pool.QueryRow(ctx, `SELECT count(*) FROM meters WHERE key = 'lost'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d meters stored (%v), want 1", n, err)
	}

	// A 409 on a retry for a meter that is not the one asked for is still
	// a conflict.
	proxy, _ = newFaultProxy(t, b.srv.URL, flakyproxy.Unavailable)
	c = adminClient(t, proxy.URL)
	_, err = c.CreateMeter(ctx, client.MeterParams{Key: "lost", EventName: "another", TokenType: "output", Models: []string{"o4-*"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Type != client.ProblemMeterExists || apiErr.Attempts != 2 {
		t.Fatalf("another meter under a taken key: %v, want meter-exists on the second attempt", err)
	}
}
