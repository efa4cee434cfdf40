-- Corrections: usage recorded wrongly is corrected by adding a usage log of
-- kind correction that holds the difference (which may be negative), never
-- by editing the original. A correction names the log it corrects
-- (corrects) and why (correction_reason); a log with corrects set is a
-- correction.
--
-- The CHECK constraints of 0001 (tokens >= 0, overage between 0 and the
-- tokens) must allow a correction's negative difference. A correction's
-- overage per dimension, max(0, T' - A) - max(0, T - A), always lies
-- between 0 and its token difference, whichever sign that has; so the new
-- rule is "between least(0, tokens) and greatest(0, tokens)", and tokens
-- below zero only for a correction.
--
-- Deployment on a large table: the two ADD COLUMNs are nullable without a
-- default (catalogue only: no rewrite, no scan). Dropping a CHECK is
-- catalogue only. The new CHECK is added NOT VALID, which takes the ACCESS
-- EXCLUSIVE lock for an instant and checks only rows written from now on;
-- proving it for the existing rows (a full scan) is 0011, which runs in its
-- own transaction under a lock that lets ingest keep writing.
-- lock_timeout makes the migration give up rather than queue every writer
-- behind a long transaction; it then applied nothing and can be run again.

SET LOCAL lock_timeout = '10s';

ALTER TABLE usage_logs
    ADD COLUMN corrects uuid,
    ADD COLUMN correction_reason text,
    DROP CONSTRAINT usage_logs_input_tokens_check,
    DROP CONSTRAINT usage_logs_output_tokens_check,
    DROP CONSTRAINT usage_logs_check,
    DROP CONSTRAINT usage_logs_check1,
    ADD CONSTRAINT usage_logs_tokens_check CHECK (
        (corrects IS NOT NULL OR (input_tokens >= 0 AND output_tokens >= 0))
        AND overage_input_tokens BETWEEN least(0, input_tokens) AND greatest(0, input_tokens)
        AND overage_output_tokens BETWEEN least(0, output_tokens) AND greatest(0, output_tokens)
        AND (corrects IS NULL) = (correction_reason IS NULL)
    ) NOT VALID;
