-- The queue the claim scripts time (`claim_call_cycle.sql`, `claim_statement_forms.sql`),
-- included by both with `\ir`: a topic of 40k messages, half of them matching one group's 100
-- patterns, with the group's routing cursor and install in place.

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
