-- The warm register's one statement (ADR 0052) as pgbench replays it: the server's share of a
-- register with no client in the way (docs/benchmarks.md, "The server's share of a warm
-- register"). It is the statement `register_statements` sees a warm swap send, with its
-- parameters turned into expressions pgbench needs no variables for: a random one of 50
-- groups and of the bench's two binding sets (`p`), an event sequence from `seqgen` (the real
-- statement binds the next one), and checks written so that they always hold (the version
-- compared with itself, the head with zero, the time with an hour ago) but cost what the real
-- ones cost. The observation is checked as a swap's usually is since ADR 0056: no live
-- instance and no open wait of the declarer, two probes by key (before it, the JSON of both
-- was built and compared as jsonb). Since ADR 0064 the install writes its set once, as the
-- effective declaration's array (the two parts that wrote `binding` rows are gone). Run against a scratch database with Wharf's Postgres
-- migrations applied:
--
--   createdb -h 127.0.0.1 -U postgres regbench
--   for f in migrations/postgres/*.sql; do psql -q -h 127.0.0.1 -U postgres -d regbench -f "$f"; done
--   psql -h 127.0.0.1 -U postgres -d regbench -c "INSERT INTO consumer_group (group_name, topic)
--     SELECT 'group-' || i, 'orders' FROM generate_series(0, 49) i" -c "CREATE SEQUENCE seqgen"
--     -c "CREATE TABLE bench_raw (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)"
--   echo "INSERT INTO bench_raw (body) VALUES ('row 1');" > /tmp/insert.sql
--   pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 1 -T 5 -f tests/benches/sql/register_statement.sql regbench
--   pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 1 -T 5 -f /tmp/insert.sql regbench
--
-- Alternate the two and compare tps. A colon followed by a letter starts a pgbench variable,
-- so the advisory lock's key spells its colon as chr(58) and the JSON has a space after each
-- colon.
WITH p AS (SELECT 'group-' || floor(random()*50)::int AS g, floor(random()*2)::int AS r)
, version_bump AS (UPDATE consumer_group SET version = version + 1 WHERE group_name = (SELECT g FROM p) RETURNING version)
, version_checked AS (SELECT wharf_expect_version((SELECT version FROM version_bump), (SELECT version FROM version_bump)) AND wharf_expect_assumed(COALESCE((SELECT sequence FROM events WHERE aggregate_type = 'consumer_group' AND aggregate_id = (SELECT g FROM p) ORDER BY sequence DESC LIMIT 1), 0) >= 0, 'stream head') AND wharf_expect_assumed(NOT EXISTS (SELECT 1 FROM worker_instance WHERE group_name = (SELECT g FROM p) AND heartbeat_at > clock_timestamp() - make_interval(secs => 0.4)) AND NOT EXISTS (SELECT 1 FROM open_wait WHERE group_name = (SELECT g FROM p) AND declarer = 'deploy-2'), 'observed') AND wharf_expect_assumed(clock_timestamp() >= now() - interval '1 hour', 'decision time') AS checked)
, append_lock AS (SELECT pg_advisory_xact_lock(hashtext(current_schema() || chr(58) || 'wharf.events')) FROM version_checked)
, appended AS (INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) SELECT 'consumer_group', (SELECT g FROM p), nextval('seqgen'), 'DeclarationInstalled', '1.0', '{"kind": "installed","group": "billing","topic": "orders","declarer": "deploy-7","version": "1","patterns": ["orders/h"],"declared_at": "2026-12-03T06:39:24.202795Z","attempt_at": "2026-12-03T06:39:24.202795Z","previous": ["orders/g"]}'::json, '{"declarer": "deploy-7","wharf_version": "0.1.0"}'::json FROM append_lock RETURNING position, recorded_at)
, effective_upserted AS (INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, previous, declared_at, attempt_at, position, installs) SELECT (SELECT g FROM p), 'orders', 'deploy-7', '1', CASE WHEN (SELECT r FROM p) = 0 THEN '{orders/+/paid,orders/+/refunded}'::text[] ELSE '{orders/#}'::text[] END, '{orders/g}'::text[], now(), now(), (SELECT position FROM appended), 1 ON CONFLICT (group_name) DO UPDATE SET topic = excluded.topic, declarer = excluded.declarer, version = excluded.version, patterns = excluded.patterns, previous = excluded.previous, declared_at = excluded.declared_at, attempt_at = excluded.attempt_at, position = excluded.position, installs = effective_declaration.installs + 1)
, open_wait_changed AS (DELETE FROM open_wait WHERE group_name = (SELECT g FROM p) AND (declarer = 'deploy-7' OR patterns = '{orders/h}'::text[]))
SELECT checked, clock_timestamp() FROM version_checked;
