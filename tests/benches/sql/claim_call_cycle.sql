-- The claim call's server time, migration 0019's function (one statement per key) against the
-- current `wharf_claim` (migration 0021, ADR 0054), alternating (docs/benchmarks.md, "The claim
-- call set-based").
--
-- Run in a scratch schema that has Wharf's Postgres migrations applied, e.g.:
--   psql "$URL" -c 'CREATE SCHEMA cfexp'
--   for f in migrations/postgres/*.sql; do PGOPTIONS='-c search_path=cfexp' psql -q "$URL" -f "$f"; done
--   PGOPTIONS='-c search_path=cfexp' psql -q "$URL" -f tests/benches/sql/claim_call_cycle.sql
--   for r in 1 2 3 4 5 6; do for fn in wharf_claim_0019 wharf_claim; do
--     PGOPTIONS='-c search_path=cfexp -c synchronous_commit=off' psql -q "$URL" \
--       -c 'CALL claim_cycle_refill()' -c "CALL cycle_bench('$fn', 1000)"; done; done
-- Each `cycle_bench` claims 10 at a time from 20k deliveries (over 40k messages), each call
-- carrying the previous call's 10 acks, and commits after each; it prints the call's mean
-- time (not the commit's).

INSERT INTO topic (name, head) VALUES ('telemetry', 40000) ON CONFLICT DO NOTHING;
INSERT INTO consumer_group (group_name, topic, routed_position, claim_floor, routed_install,
  rescan_position, rescan_until)
VALUES ('thermostats', 'telemetry', 40000, 1, 7, 1, 0) ON CONFLICT DO NOTHING;
INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, declared_at,
  attempt_at, position, installs)
SELECT 'thermostats', 'telemetry', 'd', '1',
  ARRAY(SELECT 'sensors/' || i || '/+' FROM generate_series(0, 99) i), now(), now(), 7, 1
ON CONFLICT DO NOTHING;
INSERT INTO message (topic, position, subject, payload, headers)
SELECT 'telemetry', g,
  CASE WHEN g % 2 = 1 THEN 'sensors/' ELSE 'metrics/' END || (g / 2 % 100) || '/temp',
  convert_to(repeat('a', 64), 'UTF8'), '{"source":"bench"}'
FROM generate_series(1, 40000) g ON CONFLICT DO NOTHING;

-- Migration 0019's function, for comparison.
CREATE OR REPLACE FUNCTION wharf_claim_0019(
    p_group TEXT,
    p_max BIGINT,
    p_instance TEXT,
    p_token BIGINT,
    p_visibility DOUBLE PRECISION,
    p_fence BIGINT,
    p_ack_positions BIGINT[],
    p_ack_tokens BIGINT[]
) RETURNS TABLE (
    c_position BIGINT,
    c_attempts INTEGER,
    c_routed_by BIGINT,
    c_topic TEXT,
    c_subject TEXT,
    c_payload BYTEA,
    c_headers TEXT,
    c_published_at TIMESTAMPTZ,
    c_acked_token BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
AS $$
DECLARE
    v_topic TEXT;
    v_picked BIGINT[];
    v_position BIGINT;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ack_positions, 1), 0) LOOP
        DELETE FROM delivery d
        WHERE d.group_name = p_group AND d.position = p_ack_positions[i]
          AND d.claim_token = p_ack_tokens[i];
        IF FOUND THEN
            c_position := p_ack_positions[i];
            c_acked_token := p_ack_tokens[i];
            RETURN NEXT;
        END IF;
    END LOOP;
    c_acked_token := NULL;
    SELECT g.topic INTO v_topic FROM consumer_group g WHERE g.group_name = p_group;
    IF v_topic IS NULL THEN
        RETURN;
    END IF;
    v_picked := ARRAY(
        SELECT x.position FROM delivery x
        WHERE x.group_name = p_group AND x.visible_at <= clock_timestamp()
          AND x.position >= (SELECT g.claim_floor FROM consumer_group g
                             WHERE g.group_name = p_group)
          AND x.routed_by = (SELECT e.position FROM effective_declaration e
                             WHERE e.group_name = p_group AND e.topic = v_topic
                               AND (p_fence IS NULL OR e.position = p_fence))
        ORDER BY x.position LIMIT p_max FOR UPDATE SKIP LOCKED);
    FOREACH v_position IN ARRAY v_picked LOOP
        UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = p_instance,
            claim_token = p_token,
            visible_at = clock_timestamp() + make_interval(secs => p_visibility)
        WHERE d.group_name = p_group AND d.position = v_position
        RETURNING d.topic, d.attempts, d.routed_by INTO c_topic, c_attempts, c_routed_by;
        c_position := v_position;
        SELECT m.subject, m.payload, m.headers::text, m.published_at
        INTO c_subject, c_payload, c_headers, c_published_at
        FROM message m WHERE m.topic = c_topic AND m.position = v_position;
        IF FOUND THEN
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;

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
