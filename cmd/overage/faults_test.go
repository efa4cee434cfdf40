package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
)

// faultWorld is what the fault tests share: a database, the API key of a
// tenant billed for every token, and a way to run `overage serve` and
// `overage work` as real child processes.
type faultWorld struct {
	dbURL  string
	pool   *pgxpool.Pool
	apiKey string
}

func newFaultWorld(t *testing.T, dbURL string) *faultWorld {
	t.Helper()
	out, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL}, "tenant", "create", "--name", "faults", "--stripe-customer", "cus_faults")
	if err != nil {
		t.Fatal(err)
	}
	var tn struct {
		APIKey string `json:"api_key"`
	}
	if err := json.Unmarshal([]byte(out), &tn); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &faultWorld{dbURL: dbURL, pool: pool, apiKey: tn.APIKey}
}

func (w *faultWorld) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// child is an `overage` subcommand running as a child process.
type child struct {
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan error
}

// startChild runs `overage args` with env added to the test's environment;
// t's cleanup kills it if the test did not stop it.
func startChild(t *testing.T, args string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	c := &child{cmd: cmd, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Env = append(append(os.Environ(), childEnv+"="+args, "LOG_LEVEL=warn"), env...)
	cmd.Stdout, cmd.Stderr = io.Discard, c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// exited reports whether the child has exited, and how.
func (c *child) exited() (bool, error) {
	select {
	case err := <-c.done:
		c.done <- err
		return true, err
	default:
		return false, nil
	}
}

// stop sends SIGTERM and waits up to grace for the exit.
func (c *child) stop(t *testing.T, grace time.Duration) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.done:
		c.done <- err
		return err, time.Since(start)
	case <-time.After(grace):
		t.Fatalf("no exit %s after SIGTERM; stderr:\n%s", grace, tail(c.stderr.String(), 20))
		return nil, 0
	}
}

// loggedAddr waits for the start-up log line msg ("serving", or "work
// health and metrics") in a child's stderr and returns the address it
// names. Children listen on port 0 (with LOG_LEVEL=info, so they say
// where): a port reserved by listening and closing could be taken by any
// other process before the child binds it.
func loggedAddr(t *testing.T, stderr *syncbuf.Buffer, msg string) string {
	t.Helper()
	var addr string
	polltest.Until(t, fmt.Sprintf("the %q log line and its address", msg), 30*time.Second, func() bool {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.Addr != "" {
				addr = l.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// httpClient bounds each request of these tests: a server that stops
// answering fails the test instead of hanging it.
var httpClient = &http.Client{Timeout: 30 * time.Second}

// answer is one HTTP answer to a usage event.
type answer struct {
	status     int
	retryAfter string
	body       []byte
	took       time.Duration
	err        error
}

// ingestClient is the ingest client of the fault tests: a bounded wait per
// request, so a hang shows as an error rather than a stuck test.
var ingestClient = &http.Client{Timeout: 20 * time.Second}

func postUsage(addr, apiKey, key, body string) answer {
	return postTo(addr, "/v1/usage-events", apiKey, key, body)
}

func postTo(addr, path, apiKey, key, body string) answer {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err := ingestClient.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"), body: b, took: time.Since(start), err: err}
}

// flood posts distinct events from workers goroutines until stop is
// closed, each retried under its key, as a client does after a 503, until
// it is answered 2xx or giveUp passes. It returns the acknowledged events:
// request_id → usage log id.
type flood struct {
	addr, apiKey string
	mu           sync.Mutex
	acked        map[string]string
	answers      map[int]int // status → count, 0 for a transport error
	unavailable  []answer    // every 503
	worst        time.Duration
	errs         []string
	next         atomic.Int64
	// batchEvery > 0 sends every batchEvery-th request as a batch of
	// batchSize events to /v1/usage-events/batch.
	batchEvery int
}

const batchSize = 5

func newFlood(addr, apiKey string) *flood {
	return &flood{addr: addr, apiKey: apiKey, acked: map[string]string{}, answers: map[int]int{}}
}

// With serverGoing, a transport error (the server stopped listening)
// leaves the event unacknowledged instead of failing the test.
func (f *flood) run(workers int, stop <-chan struct{}, giveUp time.Duration, serverGoing bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if gone := f.one(int(f.next.Add(1)), giveUp, serverGoing); gone {
					return
				}
			}
		}()
	}
	return &wg
}

// one sends event i until it is acknowledged or giveUp passes, and reports
// whether the server was gone (serverGoing only).
func (f *flood) one(i int, giveUp time.Duration, serverGoing bool) bool {
	reqID := fmt.Sprintf("req-%d", i)
	event := func(rid string, n int) string {
		return fmt.Sprintf(`{"request_id":%q,"user_id":"u%d","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d}`, rid, n%5, 100+n%50, 10+n%20)
	}
	path, body := "/v1/usage-events", event(reqID, i)
	batch := f.batchEvery > 0 && i%f.batchEvery == 0
	var rids []string
	if batch {
		var evs []string
		for j := range batchSize {
			rid := fmt.Sprintf("%s-%d", reqID, j)
			rids = append(rids, rid)
			evs = append(evs, event(rid, i+j))
		}
		path, body = "/v1/usage-events/batch", `{"events":[`+strings.Join(evs, ",")+`]}`
	}
	deadline := time.Now().Add(giveUp)
	for {
		a := postTo(f.addr, path, f.apiKey, "key-"+reqID, body)
		f.mu.Lock()
		f.answers[a.status]++
		f.worst = max(f.worst, a.took)
		switch {
		case a.err == nil && batch && a.status == http.StatusAccepted:
			var res struct {
				Events []struct {
					ID string `json:"id"`
				} `json:"events"`
			}
			if err := json.Unmarshal(a.body, &res); err != nil || len(res.Events) != batchSize {
				f.errs = append(f.errs, fmt.Sprintf("%s: batch %d without its usage logs: %s", reqID, a.status, a.body))
			}
			for j, e := range res.Events {
				f.acked[rids[j]] = e.ID
			}
			f.mu.Unlock()
			return false
		case a.err == nil && !batch && (a.status == http.StatusAccepted || a.status == http.StatusOK):
			var l struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(a.body, &l); err != nil || l.ID == "" {
				f.errs = append(f.errs, fmt.Sprintf("%s: %d without a usage log: %s", reqID, a.status, a.body))
			}
			f.acked[reqID] = l.ID
			f.mu.Unlock()
			return false
		case a.err == nil && a.status == http.StatusServiceUnavailable:
			f.unavailable = append(f.unavailable, a)
		case a.err == nil && a.status == http.StatusConflict && strings.Contains(string(a.body), "in-progress"):
		case a.err != nil && serverGoing:
			f.mu.Unlock()
			return true
		default:
			f.errs = append(f.errs, fmt.Sprintf("%s: %d %v %s", reqID, a.status, a.err, a.body))
			f.mu.Unlock()
			return false
		}
		f.mu.Unlock()
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireRecordedOnce checks every acknowledged event against usage_logs:
// each is there once, under the id it was answered with, and no log lacks
// its idempotency record (half-written). It returns how many logs exist.
func (f *flood) requireRecordedOnce(t *testing.T, w *faultWorld) int {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(f.errs), f.errs[0])
	}
	rows, err := w.pool.Query(context.Background(), `SELECT request_id, id::text FROM usage_logs`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	for rows.Next() {
		var reqID, id string
		if err := rows.Scan(&reqID, &id); err != nil {
			t.Fatal(err)
		}
		if _, dup := stored[reqID]; dup {
			t.Fatalf("request %s recorded twice", reqID)
		}
		stored[reqID] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for reqID, id := range f.acked {
		if stored[reqID] != id {
			t.Fatalf("acknowledged %s as usage log %s; the database holds %q", reqID, id, stored[reqID])
		}
	}
	// A single event's record names its log; a batch's record is the
	// request of every event in it (request_id req-N-j under key key-req-N).
	if n := w.count(t, `SELECT count(*) FROM usage_logs l WHERE NOT EXISTS
		(SELECT 1 FROM idempotency_keys k WHERE k.usage_log_id = l.id
			OR (k.usage_log_id IS NULL AND k.idempotency_key = 'key-' || substring(l.request_id FROM '^req-[0-9]+')))`); n != 0 {
		t.Fatalf("%d usage logs without their idempotency record: half-written", n)
	}
	return len(stored)
}
