-- Operator review: one row per decision an operator took on a usage log that
-- must not be resent automatically (needs_review or failed), written in the
-- same transaction as the change it made to the log (package review). Rows
-- are never updated or deleted: this is the audit trail of who decided what,
-- why and when, and what the log looked like before.
--
-- Deployment on a large table: review_actions is new and empty, so nothing
-- is rewritten or scanned. The foreign key takes a SHARE ROW EXCLUSIVE lock
-- on usage_logs for the rest of this (short) transaction, which waits for
-- running writers and makes new ones wait behind it; lock_timeout makes the
-- migration give up instead of stalling ingest behind a long transaction.
-- It then applied nothing and can be run again.

SET LOCAL lock_timeout = '10s';

CREATE TABLE review_actions (
    id               uuid PRIMARY KEY, -- UUIDv7
    usage_log_id     uuid NOT NULL REFERENCES usage_logs (id),
    -- billed: the operator confirmed Stripe holds the usage; void: never
    -- bill it (the log becomes not_billable); resend: send it again.
    action           text NOT NULL CHECK (action IN ('billed', 'resend', 'void')),
    reason           text NOT NULL CHECK (btrim(reason) <> ''),
    actor            text NOT NULL CHECK (btrim(actor) <> ''),
    -- The log as the operator found it.
    previous_status  text NOT NULL,
    previous_message text,
    first_attempt_at timestamptz,
    -- A resend inside Stripe's idempotency window, allowed by --force.
    forced           boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX review_actions_usage_log_id ON review_actions (usage_log_id);

COMMENT ON TABLE review_actions IS
    'audit trail of operator decisions on needs_review and failed usage logs (overage review resolve); append-only';
