-- The claim call's server time, migration 0019's function (one statement per key) against the
-- current `wharf_claim` (migration 0021, ADR 0054), alternating (docs/benchmarks.md, "The claim
-- call set-based").
--
-- Run in a scratch schema that has Wharf's Postgres migrations applied, e.g.:
--   psql "$URL" -c 'CREATE SCHEMA cfexp'
--   for f in migrations/postgres/*.sql; do PGOPTIONS='-c search_path=cfexp' psql -q "$URL" -f "$f"; done
--   PGOPTIONS='-c search_path=cfexp' psql -q "$URL" -f tests/benches/sql/claim_call_cycle.sql
--   sed 's/FUNCTION wharf_claim(/FUNCTION wharf_claim_0019(/' migrations/postgres/0019_claim_by_key.sql \
--     | PGOPTIONS='-c search_path=cfexp' psql -q "$URL"
--   for r in 1 2 3 4 5 6; do for fn in wharf_claim_0019 wharf_claim; do
--     PGOPTIONS='-c search_path=cfexp -c synchronous_commit=off' psql -q "$URL" \
--       -c 'CALL claim_cycle_refill()' -c "CALL cycle_bench('$fn', 1000)"; done; done
-- Each `cycle_bench` claims 10 at a time from 20k deliveries (over 40k messages), each call
-- carrying the previous call's 10 acks, and commits after each; it prints the call's mean
-- time (not the commit's). The `sed` line creates migration 0019's function under another
-- name from the migration's own text, so the two can alternate in one schema.

\ir claim_fixture.sql

CREATE OR REPLACE PROCEDURE cycle_bench(fn text, n int) LANGUAGE plpgsql AS $$
DECLARE
  t timestamptz; el float8 := 0; ps bigint[] := '{}'; tok bigint := 0; i int; got int := 0;
  acked int := 0;
BEGIN
  FOR i IN 1..n LOOP
    t := clock_timestamp();
    EXECUTE format('SELECT array_agg(c_position) FILTER (WHERE c_acked_token IS NULL), count(c_acked_token) FROM %I($1, 10, ''i'', $2, 3600, 7, $3, array_fill($4::bigint, ARRAY[coalesce(array_length($3,1),0)]))', fn)
      INTO ps, acked USING 'thermostats', i::bigint, coalesce(ps, '{}'), tok;
    el := el + extract(epoch FROM clock_timestamp() - t);
    got := got + coalesce(array_length(ps, 1), 0);
    tok := i;
    COMMIT;
  END LOOP;
  RAISE NOTICE '% us per cycle: % (claimed %, last acked %)', fn, round((el/n*1e6)::numeric,1), got, acked;
END $$;

CREATE OR REPLACE PROCEDURE claim_cycle_refill() LANGUAGE plpgsql AS $$
BEGIN
  TRUNCATE delivery;
  INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at)
   SELECT 'thermostats','telemetry', g, 7, now(), now() FROM generate_series(1,40000,2) g;
  UPDATE consumer_group SET claim_floor = 1;
  ANALYZE delivery;
END $$;
