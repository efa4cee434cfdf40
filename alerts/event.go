package alerts

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/tenants"
)

// Event is a threshold event as delivered and listed.
type Event struct {
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Created time.Time `json:"created"`
	Data    EventData `json:"data"`
}

// EventData is what an event says.
type EventData struct {
	TenantID         uuid.UUID `json:"tenant_id"`
	Meter            string    `json:"meter"`
	PeriodStart      time.Time `json:"period_start"`
	ThresholdPercent int       `json:"threshold_percent"`
	Included         int64     `json:"included"`
	Used             int64     `json:"used"`
}

// Body is the JSON POSTed to the endpoint: the same bytes on every
// attempt, since they are rendered from the event's row alone.
func (e *Event) Body() []byte {
	b, _ := json.Marshal(e) // only strings, numbers and times
	return b
}

// SignatureHeader, EventIDHeader are the headers of a delivery.
const (
	SignatureHeader = "Overage-Signature"
	EventIDHeader   = "Overage-Event-Id"
)

// NewSecret returns a new signing secret: "whsec_" and 32 random bytes
// (tenants.NewAlertSecret, which issues each endpoint's).
func NewSecret() (string, error) { return tenants.NewAlertSecret() }

// Sign returns the Overage-Signature of body at t: "t=<unix>,v1=<hex
// HMAC-SHA256 of "<t>.<body>" keyed with the whole secret>".
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// ErrSignature is returned by Verify for a header that does not sign body
// with the secret, or is malformed, or is outside the tolerance.
var ErrSignature = errors.New("alerts: invalid Overage-Signature")

// Verify checks header against body and secret, and that its time is
// within tolerance of now (0: no check). It accepts any of several v1
// values, so a receiver keeps working while a secret rotates.
func Verify(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrSignature
	}
	if tolerance > 0 {
		d := now.Sub(time.Unix(sec, 0))
		if d > tolerance || d < -tolerance {
			return ErrSignature
		}
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return ErrSignature
}
