package workers

import (
	"errors"
	"testing"
	"time"
)

func TestDecideCombinesTheReportsOfARound(t *testing.T) {
	t.Parallel()
	failed := sendResult{kind: sendFailed, err: errors.New("500")}
	limited := func(d time.Duration) sendResult { return sendResult{kind: sendRateLimited, retryAfter: d} }
	busy := func(d time.Duration) sendResult { return sendResult{kind: sendBusy, retryAfter: d} }
	settled := sendResult{kind: sendSettled}
	for _, tc := range []struct {
		name    string
		in      []sendResult
		wantErr bool
		snooze  time.Duration
		jitter  bool
	}{
		{name: "all settled: go on", in: []sendResult{settled, settled}},
		{name: "nothing sent", in: nil},
		{name: "a real failure spends an attempt", in: []sendResult{settled, failed}, wantErr: true},
		{name: "a real failure decides over a 429", in: []sendResult{limited(5 * time.Second), failed}, wantErr: true},
		{name: "a real failure decides over busy", in: []sendResult{busy(3 * time.Second), failed, settled}, wantErr: true},
		{name: "a 429 snoozes as long as Stripe asks", in: []sendResult{limited(3 * time.Second), settled}, snooze: 3 * time.Second},
		{name: "a 429 snoozes at least a second", in: []sendResult{limited(0)}, snooze: time.Second},
		{name: "the longest 429 wins", in: []sendResult{limited(2 * time.Second), limited(4 * time.Second)}, snooze: 4 * time.Second},
		{name: "a 429 decides over busy", in: []sendResult{busy(9 * time.Second), limited(2 * time.Second)}, snooze: 2 * time.Second},
		{name: "busy snoozes with jitter", in: []sendResult{busy(3 * time.Second), settled}, snooze: 3 * time.Second, jitter: true},
		{name: "busy with no hint still snoozes", in: []sendResult{busy(0)}, snooze: time.Millisecond, jitter: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := decide(tc.in)
			if (v.err != nil) != tc.wantErr || v.snooze != tc.snooze || v.jitter != tc.jitter {
				t.Fatalf("decide = %+v, want err %v snooze %s jitter %v", v, tc.wantErr, tc.snooze, tc.jitter)
			}
		})
	}
}
