-- The reference schema of the ingest benchmarks: the least PostgreSQL work
-- an idempotent usage event needs — a usage row with its business key, an
-- outbox job with a unique key, a stored response — with nothing of the
-- product (no allowance, no counters, no River). bench/ingest.sh loads it
-- into its own database and runs bench/ref_single.pgbench and
-- bench/ref_batch.pgbench beside the product's load, so the product is
-- reported as a ratio to this floor measured in the same run.
CREATE TABLE usage_logs (
    id uuid PRIMARY KEY, tenant_id uuid NOT NULL, request_id text NOT NULL, ts timestamptz NOT NULL,
    user_id text NOT NULL, model_id text NOT NULL, input_tokens bigint NOT NULL, output_tokens bigint NOT NULL,
    overage_input_tokens bigint NOT NULL, overage_output_tokens bigint NOT NULL,
    billing_status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE UNIQUE INDEX ON usage_logs (tenant_id, request_id);
CREATE INDEX ON usage_logs (created_at, id) WHERE billing_status = 'pending';
CREATE TABLE idem (
    tenant_id uuid NOT NULL, key text NOT NULL, status text NOT NULL, fingerprint bytea NOT NULL,
    response_body bytea, expires_at timestamptz NOT NULL, PRIMARY KEY (tenant_id, key));
CREATE TABLE jobs (
    id bigserial PRIMARY KEY, kind text NOT NULL, args jsonb NOT NULL, state text NOT NULL DEFAULT 'available',
    unique_key bytea, created_at timestamptz DEFAULT now());
CREATE UNIQUE INDEX ON jobs (unique_key);
