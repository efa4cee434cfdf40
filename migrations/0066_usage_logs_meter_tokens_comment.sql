-- Says in the schema what ingest stores since this release: a log whose
-- every line of the other meters is wholly overage keeps meter_tokens NULL
-- (it equals meter_overage; 45 of such a row's 351 bytes), so a query of
-- the table reads coalesce(meter_tokens, meter_overage). A comment only:
-- no row is read or written, a brief lock on the catalogue.
SET LOCAL lock_timeout = '5s';
COMMENT ON COLUMN usage_logs.meter_tokens IS
    'tokens of each line of meter_keys; NULL when they equal meter_overage (every line wholly overage): read coalesce(meter_tokens, meter_overage)';
