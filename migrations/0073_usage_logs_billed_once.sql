-- The acceptance that bills a usage log nothing else ever changed
-- (updated_at NULL since 0072: only review, parking and a closed report
-- set it, and billed is final) writes it without the values it would
-- hold twice, as 0069 does for an overage equal to its tokens:
--   - a dimension with overage whose *_accepted_at is NULL was accepted
--     at billed_at (acceptance stamps both with its transaction's now(),
--     so the dimension accepted last always has billed_at's time);
--   - output_report_lead NULL with output overage is input_report_lead
--     (formation puts both dimensions of a log in reports of one lead).
-- In a billed month those were 32 of a log's 206 bytes of tuple
-- (docs/benchmarks.md, "A billed log written once"). Every read goes
-- through usagelog.InputAcceptedAtSQL, OutputAcceptedAtSQL and
-- OutputReportLeadSQL, and so must a query of your own: the columns'
-- comments say so. In any other log (billed by a review's resolution, or
-- changed by one before its acceptance) the columns mean what they did: a
-- NULL accepted time is a dimension Stripe never accepted. Catalogue only.
COMMENT ON COLUMN usage_logs.input_accepted_at IS 'when Stripe accepted the input dimension; NULL in a log billed with updated_at NULL and input overage: billed_at (read usagelog.InputAcceptedAtSQL)';
COMMENT ON COLUMN usage_logs.output_accepted_at IS 'when Stripe accepted the output dimension; NULL in a log billed with updated_at NULL and output overage: billed_at (read usagelog.OutputAcceptedAtSQL)';
COMMENT ON COLUMN usage_logs.output_report_lead IS 'lead of the report carrying the output dimension; NULL in a log billed with updated_at NULL and output overage: input_report_lead (read usagelog.OutputReportLeadSQL)';
