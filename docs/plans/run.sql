SET statement_timeout = 120000;
\i /tmp/plans/stmts.sql
\set ex 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)'
SELECT now() - interval '35 days' AS d0, now() - interval '34 days' AS d1 \gset
SET plan_cache_mode = force_custom_plan;
\echo ===== MODE force_custom_plan
\echo ### lockCandidates
BEGIN; :ex EXECUTE lockCandidates(:'tp', 500); ROLLBACK;
\echo ### insertReport
BEGIN; :ex EXECUTE insertReport((lpad(to_hex(floor(extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid, 'input', :'tp', now(), current_date, 5, now(), ARRAY[gen_random_uuid()], 'open', NULL, 60, 60); ROLLBACK;
\echo ### formMembership
BEGIN; :ex EXECUTE formMembership(ARRAY[:'plid'::uuid, gen_random_uuid()], ARRAY[gen_random_uuid(), NULL], ARRAY[NULL, NULL]::uuid[], '{}'::uuid[], '{0,0}', '{0,0}'); ROLLBACK;
\echo ### acceptReport
BEGIN; :ex EXECUTE acceptReport(:'rlead', 'input'); ROLLBACK;
\echo ### acceptMembers
BEGIN; :ex EXECUTE acceptMembers(ARRAY[:'plid'::uuid, gen_random_uuid()], '{t,t}', '{t,f}', ARRAY[:'plid'::uuid], '{m1}'); ROLLBACK;
\echo ### closeReport
BEGIN; :ex EXECUTE closeReport(:'rlead', 'input', 'needs_review', '', 'x', 60); ROLLBACK;
\echo ### closeMembers
BEGIN; :ex EXECUTE closeMembers(ARRAY[:'plid'::uuid, gen_random_uuid()], 'failed', 'x'); ROLLBACK;
\echo ### parkOpen
BEGIN; :ex EXECUTE parkOpen(:'tp', 'x'); ROLLBACK;
\echo ### claim
BEGIN; :ex EXECUTE claim(:'tp', 60, 100); ROLLBACK;
\echo ### release
BEGIN; :ex EXECUTE release(ARRAY[:'rlead'::uuid], '{input}'); ROLLBACK;
\echo ### heldFor
:ex EXECUTE heldFor(:'tp');
\echo ### expiredReports
:ex EXECUTE expiredReports(100, 79200);
\echo ### tenantsPendingSince
:ex EXECUTE tenantsPendingSince(600);
\echo ### lockForReview
BEGIN; :ex EXECUTE lockForReview(:'lid', 86400); ROLLBACK;
\echo ### resolveReports
BEGIN; :ex EXECUTE resolveReports(:'lid', 'accepted', 'x'); ROLLBACK;
\echo ### resolveLogs
BEGIN; :ex EXECUTE resolveLogs(ARRAY[:'lid'::uuid], 'billed', 'x'); ROLLBACK;
\echo ### tenantOf
:ex EXECUTE tenantOf(:'lid');
\echo ### workerTenant
:ex EXECUTE workerTenant(:'tp');
\echo ### statusOneTenant
:ex EXECUTE statusOneTenant(:'tp');
\echo ### statusPage
:ex EXECUTE statusPage(NULL, NULL, 51);
\echo ### totals
:ex EXECUTE totals;
\echo ### extraMetersAll
:ex EXECUTE extraMetersAll;
\echo ### extraMetersTenants
:ex EXECUTE extraMetersTenants(ARRAY[:'tp'::uuid]);
\echo ### readBacklog
:ex EXECUTE readBacklog;
\echo ### reconcileBilled
:ex EXECUTE reconcileBilled(:'d0', :'d1', now() - interval '1 hour');
\echo ### reconcileBilledTenants
:ex EXECUTE reconcileBilledTenants(:'d0', :'d1', now() - interval '1 hour', ARRAY[:'tp'::uuid]);
\echo ### billedOnMeters
:ex EXECUTE billedOnMeters(:'d0', :'d1');
\echo ### getLog
:ex EXECUTE getLog(:'lid');
\echo ### correctionsOf
:ex EXECUTE correctionsOf(:'lid');
\echo ### streamRow
:ex EXECUTE streamRow(:'tp', :'rid');
\echo ### byRequestID
:ex EXECUTE byRequestID(:'tp', :'rid', NULL, 51);
SET plan_cache_mode = force_generic_plan;
\echo ===== MODE force_generic_plan
\echo ### lockCandidates
BEGIN; :ex EXECUTE lockCandidates(:'tp', 500); ROLLBACK;
\echo ### insertReport
BEGIN; :ex EXECUTE insertReport((lpad(to_hex(floor(extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid, 'input', :'tp', now(), current_date, 5, now(), ARRAY[gen_random_uuid()], 'open', NULL, 60, 60); ROLLBACK;
\echo ### formMembership
BEGIN; :ex EXECUTE formMembership(ARRAY[:'plid'::uuid, gen_random_uuid()], ARRAY[gen_random_uuid(), NULL], ARRAY[NULL, NULL]::uuid[], '{}'::uuid[], '{0,0}', '{0,0}'); ROLLBACK;
\echo ### acceptReport
BEGIN; :ex EXECUTE acceptReport(:'rlead', 'input'); ROLLBACK;
\echo ### acceptMembers
BEGIN; :ex EXECUTE acceptMembers(ARRAY[:'plid'::uuid, gen_random_uuid()], '{t,t}', '{t,f}', ARRAY[:'plid'::uuid], '{m1}'); ROLLBACK;
\echo ### closeReport
BEGIN; :ex EXECUTE closeReport(:'rlead', 'input', 'needs_review', '', 'x', 60); ROLLBACK;
\echo ### closeMembers
BEGIN; :ex EXECUTE closeMembers(ARRAY[:'plid'::uuid, gen_random_uuid()], 'failed', 'x'); ROLLBACK;
\echo ### parkOpen
BEGIN; :ex EXECUTE parkOpen(:'tp', 'x'); ROLLBACK;
\echo ### claim
BEGIN; :ex EXECUTE claim(:'tp', 60, 100); ROLLBACK;
\echo ### release
BEGIN; :ex EXECUTE release(ARRAY[:'rlead'::uuid], '{input}'); ROLLBACK;
\echo ### heldFor
:ex EXECUTE heldFor(:'tp');
\echo ### expiredReports
:ex EXECUTE expiredReports(100, 79200);
\echo ### tenantsPendingSince
:ex EXECUTE tenantsPendingSince(600);
\echo ### lockForReview
BEGIN; :ex EXECUTE lockForReview(:'lid', 86400); ROLLBACK;
\echo ### resolveReports
BEGIN; :ex EXECUTE resolveReports(:'lid', 'accepted', 'x'); ROLLBACK;
\echo ### resolveLogs
BEGIN; :ex EXECUTE resolveLogs(ARRAY[:'lid'::uuid], 'billed', 'x'); ROLLBACK;
\echo ### tenantOf
:ex EXECUTE tenantOf(:'lid');
\echo ### workerTenant
:ex EXECUTE workerTenant(:'tp');
\echo ### statusOneTenant
:ex EXECUTE statusOneTenant(:'tp');
\echo ### statusPage
:ex EXECUTE statusPage(NULL, NULL, 51);
\echo ### totals
:ex EXECUTE totals;
\echo ### extraMetersAll
:ex EXECUTE extraMetersAll;
\echo ### extraMetersTenants
:ex EXECUTE extraMetersTenants(ARRAY[:'tp'::uuid]);
\echo ### readBacklog
:ex EXECUTE readBacklog;
\echo ### reconcileBilled
:ex EXECUTE reconcileBilled(:'d0', :'d1', now() - interval '1 hour');
\echo ### reconcileBilledTenants
:ex EXECUTE reconcileBilledTenants(:'d0', :'d1', now() - interval '1 hour', ARRAY[:'tp'::uuid]);
\echo ### billedOnMeters
:ex EXECUTE billedOnMeters(:'d0', :'d1');
\echo ### getLog
:ex EXECUTE getLog(:'lid');
\echo ### correctionsOf
:ex EXECUTE correctionsOf(:'lid');
\echo ### streamRow
:ex EXECUTE streamRow(:'tp', :'rid');
\echo ### byRequestID
:ex EXECUTE byRequestID(:'tp', :'rid', NULL, 51);
