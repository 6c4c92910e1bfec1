-- Each consumer group's open waits, kept inline with the declaration events (ADR 0049): a
-- declarer's row appears with its `DeclarationWaiting` event (its newest waiting attempt's set
-- and first declaration time) and goes when it installs or when anyone installs the set it
-- waits for. The register decision reads the registering declarer's row by key, so a group's
-- saved state no longer carries every declarer that ever waited.
CREATE TABLE IF NOT EXISTS open_wait (
    group_name  TEXT        NOT NULL,
    declarer    TEXT        NOT NULL,
    patterns    TEXT[]      NOT NULL,
    declared_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, declarer)
);

-- The rows the ledger already implies: a declarer whose newest event in its group is a wait,
-- and whose set no install after that wait put in effect. (`rebuild --verify` compares this
-- table with a replay like every projection table.)
INSERT INTO open_wait (group_name, declarer, patterns, declared_at)
WITH declaration AS MATERIALIZED (
    SELECT e.position, e.aggregate_id AS group_name, p ->> 'declarer' AS declarer,
           p ->> 'kind' AS kind, p -> 'patterns' AS patterns, p ->> 'declared_at' AS declared_at
    FROM events e CROSS JOIN LATERAL (SELECT e.payload::jsonb AS p) parsed
    WHERE e.aggregate_type = 'consumer_group'
),
newest AS (
    SELECT DISTINCT ON (group_name, declarer) *
    FROM declaration
    ORDER BY group_name, declarer, position DESC
),
last_install AS (
    SELECT group_name, patterns, MAX(position) AS position
    FROM declaration WHERE kind = 'installed'
    GROUP BY group_name, patterns
)
SELECT n.group_name, n.declarer,
       ARRAY(SELECT jsonb_array_elements_text(n.patterns)), n.declared_at::timestamptz
FROM newest n
LEFT JOIN last_install i ON i.group_name = n.group_name AND i.patterns = n.patterns
WHERE n.kind = 'waiting' AND (i.position IS NULL OR i.position < n.position)
ON CONFLICT DO NOTHING;
