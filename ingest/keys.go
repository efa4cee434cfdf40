package ingest

import (
	"strconv"
	"time"
)

// The SQL of idempotency records and of the settings every ingest
// transaction runs under, shared by the pipelined path (single events,
// groups, batches) and the claimed-key path (corrections, checkpoints).

// txSettingsSQL bounds the transaction (as SET LOCAL would: the key stays
// in progress exactly as long as it) and keeps its plans on the indexes.
//
// Every read of an ingest transaction is a lookup by a whole key. A plan
// made while a table was small or not yet analysed picks a sequential or
// a bitmap scan of the tenant's rows instead (measured: a generic plan of
// the key lookup made at 5 rows read all 50,005 rows of the tenant at
// 50,005; one made on an empty table, a bitmap of the tenant's 47,565
// keys), and a cached generic plan keeps it until the next ANALYZE. With
// both off the planner has only index scans left for the lookups, so they
// read what they answer at any table size and any statistics; they change
// nothing else (nothing here scans).
var txSettingsSQL = `set_config('idle_in_transaction_session_timeout', '` + strconv.FormatInt(lockTimeout.Milliseconds(), 10) + `ms', true),
	set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true)`

// txSettingsColumns is how many columns txSettingsSQL selects.
const txSettingsColumns = 3

// keyHorizon bounds the expiry of any live record: a record is written
// with now() + KeyTTL, and a writer that committed before this transaction
// read may have started a little after it. Records beyond it cannot exist,
// so partitions beyond it are pruned from the lookup (see
// migrations/0024-0026 and the idempotency package).
const keyHorizon = KeyTTL + time.Hour

// keysSQL reads the newest stored record of each key in $2 of tenant $1,
// live or expired. The lookup is one index probe per key and partition on
// the whole key (tenant_id, idempotency_key): the key is a parameter of
// the inner scan, not a filter over the tenant's rows, whatever the
// statistics say. An expired record is replaced (deleteExpiredKeySQL); a
// key has at most one record in each partition.
var keysSQL = `SELECT k.key, r.fingerprint, r.response_status, r.response_body, r.usage_log_id, r.expires_at, r.expires_at <= now()
	FROM unnest($2::text[]) AS k (key)
	CROSS JOIN LATERAL (
		SELECT i.fingerprint, i.response_status, i.response_body, i.usage_log_id, i.expires_at
		FROM idempotency_keys i
		WHERE i.tenant_id = $1 AND i.idempotency_key = k.key
		  AND i.expires_at <= now() + interval '` + strconv.FormatInt(int64(keyHorizon.Seconds()), 10) + ` seconds'
		ORDER BY i.expires_at DESC
		LIMIT 1) AS r`

// deleteExpiredKeySQL removes one expired record before its key is stored
// anew: one statement a key (rare: a key reused after KeyTTL), each an
// index lookup on the whole row identity.
const deleteExpiredKeySQL = `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2 AND expires_at = $3`

// insertKeysSQL stores the answers of a transaction's members.
const insertKeysSQL = `INSERT INTO idempotency_keys
		(tenant_id, idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at)
		SELECT $1, r.key, r.fp, r.status, r.body, r.log, now() + make_interval(secs => $7)
		FROM unnest($2::text[], $3::bytea[], $4::int[], $5::bytea[], $6::uuid[]) AS r (key, fp, status, body, log)`
