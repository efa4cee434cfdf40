-- Bytes a log of the unique index on request_id, by its shape (issue 18):
-- 0061's (tenant_id, md5(request_id)::uuid) against 0067's
-- md5(tenant_id::text || request_id)::uuid alone. Each in its own table
-- with that index only, made before the rows come, as a partition's is;
-- then :logs rows (default 200,000) of 100 tenants, 32-character request
-- ids as the soak's, inserted a batch of 100 of one tenant at a time, as
-- batched ingest does. Run on a scratch database:
--
--   createdb reqkeysize && psql -X -d reqkeysize -v logs=200000 -f bench/reqkeysize.sql; dropdb reqkeysize
\set ON_ERROR_STOP on
\if :{?logs}
\else
\set logs 200000
\endif
CREATE EXTENSION IF NOT EXISTS pgstattuple;
DROP TABLE IF EXISTS digest0061, key0067;
CREATE TABLE digest0061 (tenant_id uuid NOT NULL, request_id text);
CREATE UNIQUE INDEX digest0061_request_digest ON digest0061 (tenant_id, (md5(request_id)::uuid)) WHERE request_id IS NOT NULL;
CREATE TABLE key0067 (tenant_id uuid NOT NULL, request_id text);
CREATE UNIQUE INDEX key0067_request_key ON key0067 ((md5(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL;
-- psql does not substitute inside the DO body: the count goes by a setting.
SELECT set_config('reqkeysize.logs', :'logs', false) AS logs;
DO $$
DECLARE
    b int;
    t uuid;
BEGIN
    FOR b IN 0 .. (current_setting('reqkeysize.logs')::int / 100) - 1 LOOP
        t := ('00000000-0000-0000-0000-' || lpad((b % 100 + 1)::text, 12, '0'))::uuid;
        INSERT INTO digest0061 SELECT t, 'chatcmpl-' || substr(md5(b::text || '-' || g), 1, 23) FROM generate_series(1, 100) g;
        INSERT INTO key0067 SELECT t, 'chatcmpl-' || substr(md5(b::text || '-' || g), 1, 23) FROM generate_series(1, 100) g;
    END LOOP;
END
$$;
SELECT i.relname AS index, c.reltuples::bigint AS logs_est, (SELECT count(*) FROM digest0061) AS logs,
    pg_relation_size(i.oid) AS bytes, round(pg_relation_size(i.oid)::numeric / (SELECT count(*) FROM digest0061), 1) AS bytes_a_log,
    s.leaf_pages, s.avg_leaf_density
FROM pg_class i JOIN pg_index x ON x.indexrelid = i.oid JOIN pg_class c ON c.oid = x.indrelid,
    LATERAL pgstatindex(i.oid) s
WHERE i.relname IN ('digest0061_request_digest', 'key0067_request_key') ORDER BY 1;
-- The same rows indexed at once (CREATE INDEX packs the leaves to 90%):
-- the floor a partition reaches only when rebuilt.
REINDEX TABLE digest0061;
REINDEX TABLE key0067;
SELECT i.relname || ' (rebuilt)' AS index, pg_relation_size(i.oid) AS bytes,
    round(pg_relation_size(i.oid)::numeric / (SELECT count(*) FROM digest0061), 1) AS bytes_a_log, s.avg_leaf_density
FROM pg_class i, LATERAL pgstatindex(i.oid) s
WHERE i.relname IN ('digest0061_request_digest', 'key0067_request_key') ORDER BY 1;
