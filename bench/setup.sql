-- Benchmark tenants with known ids and API keys (ovg_bench and n padded
-- with zeros to an API key's 43 characters), so the HTTP load generator
-- and the pgbench script address the same rows.
INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid, 'bench' || n, 'cus_bench' || n,
       CASE WHEN n % 2 = 0 THEN 1000000 ELSE 0 END, 0
FROM generate_series(1, 100) n;
INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix)
SELECT gen_random_uuid(), ('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid,
       sha256(('ovg_bench' || lpad(n::text, 38, '0'))::bytea), 'ovg_be'
FROM generate_series(1, 100) n;
