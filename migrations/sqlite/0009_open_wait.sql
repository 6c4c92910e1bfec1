-- Each consumer group's open waits, kept inline with the declaration events (ADR 0049): a
-- declarer's row appears with its `DeclarationWaiting` event (its newest waiting attempt's set
-- as JSON text and its first declaration time in microseconds) and goes when it installs or
-- when anyone installs the set it waits for. The register decision reads the registering
-- declarer's row by key, so a group's saved state no longer carries every declarer that ever
-- waited.
CREATE TABLE IF NOT EXISTS open_wait (
    group_name  TEXT    NOT NULL,
    declarer    TEXT    NOT NULL,
    patterns    TEXT    NOT NULL,
    declared_at INTEGER NOT NULL,
    PRIMARY KEY (group_name, declarer)
);

-- The rows the ledger already implies: a declarer whose newest event in its group is a wait,
-- and whose set no install after that wait put in effect. Times are RFC 3339 text in the
-- events ("2026-12-02T10:00:00.123456Z", 0 to 9 fraction digits): whole seconds by
-- strftime, the fraction's first six digits as microseconds.
INSERT OR IGNORE INTO open_wait (group_name, declarer, patterns, declared_at)
WITH declaration AS MATERIALIZED (
    SELECT position, aggregate_id AS group_name,
           json_extract(payload, '$.declarer') AS declarer,
           json_extract(payload, '$.kind') AS kind,
           json_extract(payload, '$.patterns') AS patterns,
           json_extract(payload, '$.declared_at') AS declared_at
    FROM events WHERE aggregate_type = 'consumer_group'
),
newest AS (
    SELECT group_name, declarer, MAX(position) AS position
    FROM declaration GROUP BY group_name, declarer
),
last_install AS (
    SELECT group_name, patterns, MAX(position) AS position
    FROM declaration WHERE kind = 'installed'
    GROUP BY group_name, patterns
)
SELECT d.group_name, d.declarer, d.patterns,
       CAST(strftime('%s', substr(d.declared_at, 1, 19)) AS INTEGER) * 1000000
       + CASE WHEN substr(d.declared_at, 20, 1) = '.'
              THEN CAST(substr(substr(d.declared_at, 21, length(d.declared_at) - 21) || '000000', 1, 6) AS INTEGER)
              ELSE 0 END
FROM newest n
JOIN declaration d ON d.position = n.position
LEFT JOIN last_install i ON i.group_name = d.group_name AND i.patterns = d.patterns
WHERE d.kind = 'waiting' AND (i.position IS NULL OR i.position < d.position);
