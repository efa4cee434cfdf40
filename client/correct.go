package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
)

// CorrectionParams are the corrected totals of a usage event: 0 and 0 void
// it. Reason is required.
type CorrectionParams struct {
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	Reason       string `json:"reason"`
}

// CorrectionResult is the outcome of Correct: the new usage log of kind
// correction, holding the difference.
type CorrectionResult struct {
	Log UsageLog
	// Corrects is the id of the corrected usage log.
	Corrects string
	// StripeTimestamp is "original" when the meter event carries the
	// original's time (its period still open), else "correction".
	StripeTimestamp string
	Replayed        bool
	Key             string
	Attempts        int
}

// Correct records a correction of usage log id to the totals in p, with
// Record's retries: one key (the caller's, else a random UUID minted before
// the first attempt) and the same body on every attempt.
func (c *Client) Correct(ctx context.Context, id string, p CorrectionParams, opts *RecordOpts) (*CorrectionResult, error) {
	if id == "" {
		return nil, errors.New("overage: Correct needs the usage log id")
	}
	key := ""
	if opts != nil {
		key = opts.IdempotencyKey
	}
	if key == "" {
		key = newUUID()
	}
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("overage: encode correction: %w", err)
	}
	var answer struct {
		Corrects        string `json:"corrects"`
		StripeTimestamp string `json:"stripe_timestamp"`
	}
	res := &CorrectionResult{}
	attempts, replayed, err := c.send(ctx, "/v1/usage-events/"+url.PathEscape(id)+"/corrections", key, body, func(rb []byte) error {
		if err := json.Unmarshal(rb, &res.Log); err != nil {
			return err
		}
		return json.Unmarshal(rb, &answer)
	})
	if err != nil {
		return nil, err
	}
	res.Corrects, res.StripeTimestamp = answer.Corrects, answer.StripeTimestamp
	res.Replayed, res.Key, res.Attempts = replayed, key, attempts
	return res, nil
}
