package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ProblemStreamClosed is the refusal of a checkpoint newer than its
// stream's final one, or sent after the server closed the idle stream.
const ProblemStreamClosed = "https://overage.dev/problems/stream-closed"

// Stream reports the usage of one streamed LLM response as cumulative
// checkpoints: call Checkpoint with the totals so far as the answer
// streams (each records only the increase, so a checkpoint lost for good
// loses nothing — the next carries the totals), then Final with the
// provider's authoritative usage, which may be lower (the server records
// the difference as a correction). The stream numbers its checkpoints and
// gives checkpoint n the Idempotency-Key "<request_id>:<n>", fixed with its
// body before the first attempt, with Record's retry rules. Safe for
// concurrent use; checkpoints are numbered in call order.
type Stream struct {
	c         *Client
	requestID string
	userID    string
	modelID   string

	mu   sync.Mutex
	next int64
}

// StreamTotals is where a stream stands on the server.
type StreamTotals struct {
	Sequence     int64 `json:"sequence"`
	Final        bool  `json:"final"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Closed       bool  `json:"closed"`
}

// CheckpointResult is the outcome of one checkpoint.
type CheckpointResult struct {
	// Log is the usage log of the increase (or, for a final checkpoint
	// that only lowered totals, the correction); nil when nothing was
	// recorded.
	Log *UsageLog
	// Correction is the correction a final checkpoint recorded besides an
	// increase.
	Correction *UsageLog
	// Stale: the server already held a checkpoint at or after this one.
	Stale  bool
	Stream StreamTotals
	// Sequence is this checkpoint's number; Key its Idempotency-Key.
	Sequence int64
	Key      string
	Replayed bool
	Attempts int
}

// Stream starts reporting a streamed response identified by requestID
// (the provider's response id: the stream's key on the server).
func (c *Client) Stream(requestID, userID, modelID string) (*Stream, error) {
	if requestID == "" {
		return nil, errors.New("overage: a stream needs a request id")
	}
	return &Stream{c: c, requestID: requestID, userID: userID, modelID: modelID}, nil
}

// Checkpoint reports the totals so far.
func (s *Stream) Checkpoint(ctx context.Context, inputTokens, outputTokens int64) (*CheckpointResult, error) {
	return s.send(ctx, inputTokens, outputTokens, false)
}

// Final reports the response's final usage; no checkpoint is recorded
// after it.
func (s *Stream) Final(ctx context.Context, inputTokens, outputTokens int64) (*CheckpointResult, error) {
	return s.send(ctx, inputTokens, outputTokens, true)
}

func (s *Stream) send(ctx context.Context, in, out int64, final bool) (*CheckpointResult, error) {
	s.mu.Lock()
	seq := s.next
	s.next++
	s.mu.Unlock()
	type checkpoint struct {
		Sequence int64 `json:"sequence"`
		Final    bool  `json:"final"`
	}
	body, err := json.Marshal(struct {
		UsageEvent
		Stream checkpoint `json:"stream"`
	}{
		UsageEvent: UsageEvent{RequestID: s.requestID, Timestamp: time.Now().UTC(), UserID: s.userID, ModelID: s.modelID,
			InputTokens: in, OutputTokens: out},
		Stream: checkpoint{Sequence: seq, Final: final},
	})
	if err != nil {
		return nil, fmt.Errorf("overage: encode checkpoint: %w", err)
	}
	key := fmt.Sprintf("%s:%d", s.requestID, seq)
	var answer struct {
		ID         string        `json:"id"`
		Stale      bool          `json:"stale"`
		Stream     *StreamTotals `json:"stream"`
		Correction *UsageLog     `json:"correction"`
	}
	res := &CheckpointResult{Sequence: seq, Key: key}
	var raw []byte
	attempts, replayed, err := s.c.send(ctx, "/v1/usage-events", key, body, func(rb []byte) error {
		raw = rb
		return json.Unmarshal(rb, &answer)
	})
	if err != nil {
		return nil, err
	}
	if answer.Stream == nil {
		// A plain event recorded this request id first: the server
		// answered with its log as a duplicate.
		var l UsageLog
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, fmt.Errorf("overage: decode checkpoint answer: %w", err)
		}
		res.Log = &l
	} else {
		res.Stale, res.Stream, res.Correction = answer.Stale, *answer.Stream, answer.Correction
		if answer.ID != "" {
			var l UsageLog
			if err := json.Unmarshal(raw, &l); err != nil {
				return nil, fmt.Errorf("overage: decode checkpoint answer: %w", err)
			}
			res.Log = &l
		}
	}
	res.Replayed, res.Attempts = replayed, attempts
	return res, nil
}
