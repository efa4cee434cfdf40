-- Streaming responses reported as cumulative checkpoints (ingest/stream.go).
-- One row per (tenant, request_id) of a stream: the highest sequence
-- recorded and the totals it carried. The row lock on it (SELECT ... FOR
-- UPDATE in every checkpoint's transaction) is the referee of two
-- checkpoints of one stream racing: the second waits, then sees the
-- first's sequence and totals, so an increase is never counted twice.
--
-- Each increase is a usage log with stream_request_id set; the stream's
-- first log also carries the request_id itself, so a plain event with the
-- stream's request_id is a duplicate through the existing unique index.
--
-- Deployment on a large table: usage_streams is new and empty; the column
-- added to usage_logs is nullable without a default (catalogue only, no
-- rewrite, no scan), under lock_timeout so the migration gives up rather
-- than queue ingest behind a long transaction. Its index is built
-- concurrently by 0014.

SET LOCAL lock_timeout = '10s';

ALTER TABLE usage_logs ADD COLUMN stream_request_id text;

CREATE TABLE usage_streams (
    tenant_id          uuid NOT NULL REFERENCES tenants (id),
    request_id         text NOT NULL,
    -- -1 until the first checkpoint commits.
    sequence           bigint NOT NULL,
    input_tokens       bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens      bigint NOT NULL CHECK (output_tokens >= 0),
    final              boolean NOT NULL DEFAULT false,
    -- The stream's first usage log: the one a final checkpoint's
    -- correction corrects.
    first_usage_log_id uuid,
    last_checkpoint_at timestamptz NOT NULL,
    -- Set by the final checkpoint, or by the workers after
    -- STREAM_IDLE_TIMEOUT without a checkpoint ('idle').
    closed_at          timestamptz,
    closed_by          text CHECK (closed_by IN ('final', 'idle')),
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, request_id)
);
-- The idle closer walks open streams oldest checkpoint first; the partial
-- index stays as small as the number of open streams.
CREATE INDEX usage_streams_open ON usage_streams (last_checkpoint_at) WHERE closed_at IS NULL;
