package idempotency

import (
	"fmt"
	"strconv"
	"time"
)

// Horizon bounds the expiry of any live record: a record is written
// with now() + TTL, and a writer that committed before this transaction
// read may have started a little after it. Records beyond it cannot exist,
// so partitions beyond it are pruned from the lookup.
const Horizon = TTL + time.Hour

// LookupSQL reads the newest stored record of each key in $2 of tenant $1,
// live or expired. The lookup is one index probe per key and partition on
// the whole key (tenant_id and the key's digest, or the key itself in a
// partition made before 0052): the key is a parameter of
// the inner scan, not a filter over the tenant's rows, whatever the
// statistics say. An expired record is replaced (DeleteExpiredSQL); a
// key has at most one record in each partition.
var LookupSQL = `SELECT k.key, r.fingerprint, r.response_status, r.response_body, r.usage_log_id, r.expires_at, r.expires_at <= now()
	FROM unnest($2::text[]) AS k (key)
	CROSS JOIN LATERAL (
		SELECT i.fingerprint, i.response_status, i.response_body, i.usage_log_id, i.expires_at
		FROM idempotency_keys i
		WHERE i.tenant_id = $1 AND ` + digest("i.idempotency_key") + ` = ` + digest("k.key") + ` AND i.idempotency_key = k.key
		  AND i.expires_at <= now() + interval '` + strconv.FormatInt(int64(Horizon.Seconds()), 10) + ` seconds'
		ORDER BY i.expires_at DESC
		LIMIT 1) AS r`

// DeleteExpiredSQL removes one expired record before its key is stored
// anew: one statement a key (rare: a key reused after TTL), each an
// index lookup on the whole row identity.
var DeleteExpiredSQL = `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND ` + digest("idempotency_key") + ` = ` + digest("$2::text") + ` AND idempotency_key = $2 AND expires_at = $3`

// digest is KeyDigest of the key expression k.
func digest(k string) string { return fmt.Sprintf(KeyDigest, k) }

// InsertSQL stores the answers of a transaction's members.
const InsertSQL = `INSERT INTO idempotency_keys
		(tenant_id, idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at)
		SELECT $1, r.key, r.fp, r.status, r.body, r.log, now() + make_interval(secs => $7)
		FROM unnest($2::text[], $3::bytea[], $4::int[], $5::bytea[], $6::uuid[]) AS r (key, fp, status, body, log)`
