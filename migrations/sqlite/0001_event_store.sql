-- Wharf event store (SQLite, the embedded default). Times are integer microseconds since the
-- Unix epoch; payloads are JSON text. One writer at a time (BEGIN IMMEDIATE), so `position`
-- order is commit order.
CREATE TABLE IF NOT EXISTS events (
    position       INTEGER PRIMARY KEY AUTOINCREMENT,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    sequence       INTEGER NOT NULL,
    event_type     TEXT    NOT NULL,
    event_version  TEXT    NOT NULL,
    payload        TEXT    NOT NULL,
    metadata       TEXT    NOT NULL,
    recorded_at    INTEGER NOT NULL,
    UNIQUE (aggregate_type, aggregate_id, sequence)
);
CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at);

CREATE TABLE IF NOT EXISTS projection_checkpoint (
    projector TEXT    PRIMARY KEY,
    position  INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS consumer_group (
    group_name TEXT    PRIMARY KEY,
    topic      TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS worker_instance (
    group_name   TEXT    NOT NULL,
    declarer     TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    version      TEXT    NOT NULL,
    patterns     TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    PRIMARY KEY (group_name, declarer)
);
