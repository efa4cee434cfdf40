package ingest

import (
	"net/http"
	"testing"
	"time"

	"github.com/overage-billing/overage"
)

// TestClaimAnswer is step 2 of the one ingest transaction, the same for
// every kind of request: a live record is replayed or refused as key
// reuse whatever the lock (a committed record decides), a key whose lock
// another transaction holds is in progress, and an expired record's key
// goes on, its record to be replaced.
func TestClaimAnswer(t *testing.T) {
	t.Parallel()
	expiry := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	live := storedResponse{fingerprint: []byte("fp"), status: http.StatusAccepted, body: []byte(`{"id":"x"}`), expiresAt: expiry}
	expired := live
	expired.expired = true
	for _, tc := range []struct {
		name        string
		rec         *storedResponse
		locked      bool
		fp          string
		wantGoes    bool
		wantType    string // of the refusal, "" for none
		wantReplay  bool
		wantExpired bool
	}{
		{name: "new key", locked: true, fp: "fp", wantGoes: true},
		{name: "new key, locked elsewhere", locked: false, fp: "fp", wantType: "idempotency-key-in-progress"},
		{name: "live record", rec: &live, locked: true, fp: "fp", wantReplay: true},
		{name: "live record, locked elsewhere", rec: &live, locked: false, fp: "fp", wantReplay: true},
		{name: "live record, another body", rec: &live, locked: true, fp: "other", wantType: "idempotency-key-reused"},
		{name: "expired record", rec: &expired, locked: true, fp: "other", wantGoes: true, wantExpired: true},
		{name: "expired record, locked elsewhere", rec: &expired, locked: false, fp: "fp", wantType: "idempotency-key-in-progress"},
	} {
		c := &claim{locked: []bool{tc.locked}, recs: map[string]storedResponse{}}
		if tc.rec != nil {
			c.recs["k"] = *tc.rec
		}
		out, err, goes := c.answer(0, "k", []byte(tc.fp))
		if goes != tc.wantGoes {
			t.Errorf("%s: goes %v, want %v", tc.name, goes, tc.wantGoes)
		}
		if got := overage.AsError(err); (err != nil || tc.wantType != "") && got.Type != tc.wantType {
			t.Errorf("%s: error %v, want type %q", tc.name, err, tc.wantType)
		}
		if replayed := out != nil && out.Kind == OutcomeReplay && string(out.Body) == string(live.body); replayed != tc.wantReplay {
			t.Errorf("%s: answer %+v, want a replay: %v", tc.name, out, tc.wantReplay)
		}
		if got := len(c.expired) == 1 && c.expired[0] == (expiredKey{"k", expiry}); got != tc.wantExpired {
			t.Errorf("%s: expired records to replace %v", tc.name, c.expired)
		}
	}
}
