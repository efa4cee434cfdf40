package usagelog

import "time"

// Where a usage log's meter events take their timestamp from (the
// stripe_timestamp column and field).
const (
	// TimestampUsage: the log's period was open when its reports were
	// formed, so they carry the latest usage timestamp of their members.
	TimestampUsage = "usage"
	// TimestampReported: the log's period was closed then (its invoice may
	// be final and is never changed), so they carry the time they were
	// formed: the usage lands on the invoice Stripe still takes. The log
	// is still counted in its own period (its allowance, its overage).
	TimestampReported = "reported"
)

// DefaultPeriodCloseGrace is PERIOD_CLOSE_GRACE's default: how long after
// a billing period ends Stripe still takes usage for it, and a tenant's key
// may still correct it.
const DefaultPeriodCloseGrace = time.Hour

// PeriodOfSQL is the SQL of the allowance period start of the tenant
// (SQL tenant) at the instant ts: its Stripe subscription period covering
// ts when the webhooks told us one, else ts's calendar month in UTC.
func PeriodOfSQL(tenant, ts string) string {
	return `coalesce((SELECT s.current_period_start FROM tenant_subscriptions s
		WHERE s.tenant_id = ` + tenant + ` AND s.current_period_start <= ` + ts + ` AND ` + ts + ` < s.current_period_end
		ORDER BY s.current_period_start DESC LIMIT 1), date_trunc('month', ` + ts + `, 'UTC'))`
}

// PeriodClosedSQL is the one rule of a closed billing period, as SQL: true
// when the allowance period of the tenant (SQL tenant) that began at
// period is closed by the database clock, graceSecs (SQL, seconds) being
// PERIOD_CLOSE_GRACE. A period is closed once
//   - the period holding now() - grace began after it (so it ended more
//     than grace ago), or
//   - the subscription period it is known to have ended more than grace
//     ago (a cancelled subscription's last period, which no later one
//     follows), or
//   - Stripe finalized an invoice of the tenant's subscription whose usage
//     period ends after it began (invoice.finalized, closed_periods).
//
// Closed is for good: time only moves forward and nothing reopens a
// period, so a log found closed at ingest is closed when it is reported.
func PeriodClosedSQL(tenant, period, graceSecs string) string {
	ago := `(now() - make_interval(secs => ` + graceSecs + `))`
	return `(` + PeriodOfSQL(tenant, ago) + ` > ` + period + `
		OR EXISTS (SELECT 1 FROM tenant_subscriptions s WHERE s.tenant_id = ` + tenant + ` AND s.current_period_start = ` + period + `
			AND s.current_period_end < ` + ago + `)
		OR EXISTS (SELECT 1 FROM closed_periods c WHERE c.tenant_id = ` + tenant + ` AND c.period_end > ` + period + `))`
}
