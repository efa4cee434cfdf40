package idempotency

import "strconv"

// Horizon bounds the expiry of any live record: a record is written
// with now() + TTL, and a writer that committed before this transaction
// read may have started a little after it. Records beyond it cannot exist,
// so partitions beyond it are pruned from the lookup. The "little" is
// DropMargin, which bounds an ingest transaction as generously (an hour).
var Horizon = TTL + DropMargin

// LookupSQL reads the newest stored record of each key in $2 of tenant $1,
// live or expired. The lookup is one index probe per key and partition on
// the whole key: the key is a parameter of the inner scan, not a filter
// over the tenant's rows, whatever the statistics say. It states the
// condition of every index a partition can have (the digest of tenant and
// key since 0032, the key's digest from 0052, the key itself before), so
// each partition's plan uses the one it has. An expired record is
// replaced (DeleteExpiredSQL); a key has at most one record in each
// partition.
var LookupSQL = `SELECT k.key, r.fingerprint, r.response_status, r.response_body, r.usage_log_id, r.expires_at, r.expires_at <= now()
	FROM unnest($2::text[]) AS k (key)
	CROSS JOIN LATERAL (
		SELECT i.fingerprint, i.response_status, i.response_body, i.usage_log_id, i.expires_at
		FROM idempotency_keys i
		WHERE ` + keyConditions("i.", "$1", "k.key") + `
		  AND i.expires_at <= now() + interval '` + strconv.FormatInt(int64(Horizon.Seconds()), 10) + ` seconds'
		ORDER BY i.expires_at DESC
		LIMIT 1) AS r`

// DeleteExpiredSQL removes one expired record before its key is stored
// anew: one statement a key (rare: a key reused after TTL), each an
// index lookup on the whole row identity.
var DeleteExpiredSQL = `DELETE FROM idempotency_keys WHERE ` + keyConditions("", "$1", "$2::text") + ` AND expires_at = $3`

// keyConditions says that the record (columns prefixed by col) is tenant's
// record of key, in the terms of every unique index a partition can have.
func keyConditions(col, tenant, key string) string {
	return col + "tenant_id = " + tenant +
		" AND " + KeyDigest(col+"tenant_id", col+"idempotency_key") + " = " + KeyDigest(tenant, key) +
		" AND " + keyDigest0052(col+"idempotency_key") + " = " + keyDigest0052(key) +
		" AND " + col + "idempotency_key = " + key
}

// InsertSQL stores the answers of a transaction's members.
const InsertSQL = `INSERT INTO idempotency_keys
		(tenant_id, idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at)
		SELECT $1, r.key, r.fp, r.status, r.body, r.log, now() + make_interval(secs => $7)
		FROM unnest($2::text[], $3::bytea[], $4::int[], $5::bytea[], $6::uuid[]) AS r (key, fp, status, body, log)`
