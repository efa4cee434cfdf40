package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"
)

// faultsWire is Faults on the wire: latency as a Go duration string.
type faultsWire struct {
	ServerErrorRate    float64  `json:"server_error_rate"`
	LostResponseRate   float64  `json:"lost_response_rate"`
	RateLimitRate      float64  `json:"rate_limit_rate"`
	Latency            string   `json:"latency"`
	BlackholeCustomers []string `json:"blackhole_customers"`
}

func (f faultsWire) faults() (Faults, error) {
	out := Faults{
		ServerErrorRate:    f.ServerErrorRate,
		LostResponseRate:   f.LostResponseRate,
		RateLimitRate:      f.RateLimitRate,
		BlackholeCustomers: f.BlackholeCustomers,
	}
	for _, r := range []float64{f.ServerErrorRate, f.LostResponseRate, f.RateLimitRate} {
		if r < 0 || r > 1 {
			return Faults{}, fmt.Errorf("rate %v is not in [0, 1]", r)
		}
	}
	if f.Latency != "" {
		d, err := time.ParseDuration(f.Latency)
		if err != nil {
			return Faults{}, fmt.Errorf("latency: %w", err)
		}
		out.Latency = d
	}
	return out, nil
}

type appliedWire struct {
	Customer  string `json:"customer"`
	EventName string `json:"event_name"`
	Total     int64  `json:"total"`
}

// serveControl serves the /_emulator/ endpoints, for a test or a human
// driving an emulator in another process.
func (e *Emulator) serveControl(w http.ResponseWriter, r *http.Request) {
	send := func(v any) { writeJSON(w, http.StatusOK, mustJSON(v)) }
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/_emulator/applied":
		var out []appliedWire
		for k, v := range e.Applied() {
			out = append(out, appliedWire{Customer: k.Customer, EventName: k.EventName, Total: v})
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].Customer != out[j].Customer {
				return out[i].Customer < out[j].Customer
			}
			return out[i].EventName < out[j].EventName
		})
		send(map[string]any{"applied": out})
	case r.Method == http.MethodGet && r.URL.Path == "/_emulator/events":
		send(map[string]any{"events": e.Events()})
	case r.Method == http.MethodGet && r.URL.Path == "/_emulator/requests":
		send(map[string]any{"requests": e.Requests()})
	case r.Method == http.MethodGet && r.URL.Path == "/_emulator/faults":
		f := e.Faults()
		send(faultsWire{ServerErrorRate: f.ServerErrorRate, LostResponseRate: f.LostResponseRate,
			RateLimitRate: f.RateLimitRate, Latency: f.Latency.String(), BlackholeCustomers: f.BlackholeCustomers})
	case r.Method == http.MethodPost && r.URL.Path == "/_emulator/faults":
		var in faultsWire
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		err := dec.Decode(&in)
		var f Faults
		if err == nil {
			f, err = in.faults()
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, mustJSON(map[string]string{"error": "bad faults: " + err.Error()}))
			return
		}
		e.SetFaults(f)
		send(in)
	default:
		writeJSON(w, http.StatusNotFound, mustJSON(map[string]string{"error": "unknown emulator control endpoint"}))
	}
}
