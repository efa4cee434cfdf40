-- The optional parts of an event's totals: cached input read and written
-- (part of input_tokens) and reasoning (part of output_tokens), NULL where
-- the caller did not report them. Nullable columns without a default are
-- catalogue-only on a table of any size; the checks are NOT VALID (every
-- existing row has NULLs, which pass) and hold for every new row.
SET LOCAL lock_timeout = '10s';
ALTER TABLE usage_logs
    ADD COLUMN cache_read_input_tokens bigint,
    ADD COLUMN cache_creation_input_tokens bigint,
    ADD COLUMN reasoning_output_tokens bigint,
    ADD CONSTRAINT usage_logs_cached_input_within_input CHECK (
        (cache_read_input_tokens IS NULL AND cache_creation_input_tokens IS NULL)
        OR (coalesce(cache_read_input_tokens, 0) >= 0 AND coalesce(cache_creation_input_tokens, 0) >= 0
            AND coalesce(cache_read_input_tokens, 0) + coalesce(cache_creation_input_tokens, 0) <= input_tokens)) NOT VALID,
    ADD CONSTRAINT usage_logs_reasoning_within_output CHECK (
        reasoning_output_tokens IS NULL OR reasoning_output_tokens BETWEEN 0 AND output_tokens) NOT VALID;
