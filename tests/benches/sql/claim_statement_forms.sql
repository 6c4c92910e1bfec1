-- The claim statement's three forms timed side by side on the server (docs/benchmarks.md,
-- "Where the Postgres cost went"): before the fence (4075140), the CTE joining consumer_group and
-- effective_declaration (main at ef65371), and the two scalar subqueries (queue/src/postgres/claim.rs).
--
-- Run in a scratch schema that has Wharf's Postgres migrations applied, e.g.:
--   psql "$URL" -c 'CREATE SCHEMA cbprof'
--   for f in migrations/postgres/*.sql; do PGOPTIONS='-c search_path=cbprof' psql -q "$URL" -f "$f"; done
--   PGOPTIONS='-c search_path=cbprof -c synchronous_commit=off' psql "$URL" -f tests/benches/sql/claim_statement_forms.sql
-- Each round refills 20k deliveries over 40k messages (half matching, 100 patterns) and runs
-- CALL claim_bench(500): each form claims 10 in turn (EXECUTE: parsed and planned every call,
-- like sqlx's unnamed statement), its rows are deleted (the ack) and committed.

\ir claim_fixture.sql

CREATE OR REPLACE PROCEDURE claim_bench(n int) LANGUAGE plpgsql AS $$
DECLARE
  sqls text[] := ARRAY[
$q$WITH claimed AS (
  UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = 'i', claim_token = 1,
    visible_at = clock_timestamp() + make_interval(secs => 3600)
  WHERE d.group_name = 'thermostats' AND d.position = ANY(ARRAY(
    SELECT position FROM delivery
    WHERE group_name = 'thermostats' AND visible_at <= clock_timestamp()
      AND position >= (SELECT claim_floor FROM consumer_group WHERE group_name = 'thermostats')
    ORDER BY position LIMIT 10 FOR UPDATE SKIP LOCKED))
  RETURNING d.topic, d.position, d.attempts, d.routed_by)
SELECT array_agg(c.position) FROM (SELECT c.topic, c.position, c.attempts, c.routed_by, m.subject, m.payload, m.headers, m.published_at
FROM claimed c JOIN message m ON m.topic = c.topic AND m.position = c.position ORDER BY c.position) c$q$,
$q$WITH g AS (
  SELECT g.claim_floor, e.position AS install FROM consumer_group g
  JOIN effective_declaration e ON e.group_name = g.group_name
  WHERE g.group_name = 'thermostats' AND (7::bigint IS NULL OR e.position = 7)),
claimed AS (
  UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = 'i', claim_token = 1,
    visible_at = clock_timestamp() + make_interval(secs => 3600)
  WHERE d.group_name = 'thermostats' AND d.position = ANY(ARRAY(
    SELECT position FROM delivery
    WHERE group_name = 'thermostats' AND visible_at <= clock_timestamp()
      AND position >= (SELECT claim_floor FROM g)
      AND routed_by = (SELECT install FROM g)
    ORDER BY position LIMIT 10 FOR UPDATE SKIP LOCKED))
  RETURNING d.topic, d.position, d.attempts, d.routed_by)
SELECT array_agg(c.position) FROM (SELECT c.topic, c.position, c.attempts, c.routed_by, m.subject, m.payload, m.headers, m.published_at
FROM claimed c JOIN message m ON m.topic = c.topic AND m.position = c.position ORDER BY c.position) c$q$,
$q$WITH claimed AS (
  UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = 'i', claim_token = 1,
    visible_at = clock_timestamp() + make_interval(secs => 3600)
  WHERE d.group_name = 'thermostats' AND d.position = ANY(ARRAY(
    SELECT position FROM delivery
    WHERE group_name = 'thermostats' AND visible_at <= clock_timestamp()
      AND position >= (SELECT claim_floor FROM consumer_group WHERE group_name = 'thermostats')
      AND routed_by = (SELECT position FROM effective_declaration WHERE group_name = 'thermostats' AND (7::bigint IS NULL OR position = 7))
    ORDER BY position LIMIT 10 FOR UPDATE SKIP LOCKED))
  RETURNING d.topic, d.position, d.attempts, d.routed_by)
SELECT array_agg(c.position) FROM (SELECT c.topic, c.position, c.attempts, c.routed_by, m.subject, m.payload, m.headers, m.published_at
FROM claimed c JOIN message m ON m.topic = c.topic AND m.position = c.position ORDER BY c.position) c$q$];
  t timestamptz; el float8[] := ARRAY[0,0,0]; ps bigint[]; i int; k int;
BEGIN
  FOR i IN 1..n LOOP
    FOR k IN 1..3 LOOP
      t := clock_timestamp();
      EXECUTE sqls[k] INTO ps;
      el[k] := el[k] + extract(epoch FROM clock_timestamp() - t);
      DELETE FROM delivery WHERE group_name = 'thermostats' AND position = ANY(ps);
      COMMIT;
    END LOOP;
  END LOOP;
  RAISE NOTICE 'us per claim: before % | cte+join % | two initplans %', round((el[1]/n*1e6)::numeric,1), round((el[2]/n*1e6)::numeric,1), round((el[3]/n*1e6)::numeric,1);
END $$;

-- Eight rounds.
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
TRUNCATE delivery;
INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
 SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
UPDATE consumer_group SET claim_floor = 1;
VACUUM ANALYZE delivery;
CALL claim_bench(500);
