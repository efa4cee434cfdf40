package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/overage-billing/overage/stripeclient"

	"go.uber.org/goleak"
)

// The test binary doubles as the emulator binary: re-executed with this
// variable set, it runs main with the arguments it names. That tests the
// real process boundary (flags, the printed URL, signals) without a
// separate go build.
const childEnv = "STRIPE_EMULATOR_TEST_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childEnv); ok {
		os.Exit(exitStatus(run(strings.Fields(args))))
	}
	// Otherwise the tests, failed if a goroutine outlives them.
	goleak.VerifyTestMain(m)
}

func TestStandaloneEmulator(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=-addr 127.0.0.1:0 -seed 3 -lost 1 -api-key sk_test_standalone")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("stdout pipe: %v", err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the emulator: %v", err)
	}
	exited := make(chan error, 1)
	// Only matters when the test fails before its SIGTERM; after a clean
	// exit Kill just reports that the process is done.
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the base URL: %v", err)
	}
	base := strings.TrimSpace(line)
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("first line %q is not a base URL", line)
	}
	go func() { exited <- cmd.Wait() }()

	client, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_standalone", APIBase: base})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ev := stripeclient.MeterEvent{EventName: "llm_output_tokens", CustomerID: "cus_proc", Value: 77,
		Timestamp: time.Now(), Key: "usage-log:proc:output"}

	// -lost 1: applied, answer dropped.
	if _, err := client.SendMeterEvent(context.Background(), ev); !stripeclient.IsRetryable(err) {
		t.Fatalf("with -lost 1: got %v, want a retryable error", err)
	}
	var events struct {
		Events []struct {
			Identifier string `json:"identifier"`
			Value      int64  `json:"value"`
		} `json:"events"`
	}
	getJSON(t, base+"/_emulator/events", &events)
	if len(events.Events) != 1 || events.Events[0].Identifier != ev.Key || events.Events[0].Value != 77 {
		t.Fatalf("events after the lost response: %+v", events)
	}

	resp, err := http.Post(base+"/_emulator/faults", "application/json", strings.NewReader(`{"lost_response_rate":0}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("clearing faults: %v %v", err, resp)
	}
	resp.Body.Close()
	res, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || !res.Replayed {
		t.Fatalf("retry: %+v %v, want a replay", res, err)
	}
	getJSON(t, base+"/_emulator/events", &events)
	if len(events.Events) != 1 {
		t.Errorf("%d events after the retry, want 1", len(events.Events))
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the emulator did not exit on SIGTERM")
	}
}

func TestFlagsAreValidated(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-lost", "1.5"}, {"-429", "-0.1"}, {"-nope"}, {"-addr", "256.0.0.1:0"}} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decoding: %v", url, err)
	}
}

func TestHelpExitsZeroAndABadFlagTwo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args       string
		code       int
		out, inErr string
	}{{"-h", 0, "-addr", ""}, {"--help", 0, "-lost", ""}, {"-bogus", 2, "", "-bogus"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+tc.args)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.inErr) ||
			(tc.code == 0 && errOut.Len() > 0) || (tc.code != 0 && strings.Count(errOut.String(), "\n") != 2) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", tc.args, code, out.String(), errOut.String())
		}
	}
}
