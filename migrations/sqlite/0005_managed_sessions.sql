-- Managed MQTT sessions (see the Postgres twin for the meaning of each table). Times are
-- microseconds of the store's clock.

CREATE TABLE IF NOT EXISTS aggregate_lock (
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    version        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

CREATE TABLE IF NOT EXISTS managed_session (
    session_id         TEXT    PRIMARY KEY,
    baseline_source    TEXT    NOT NULL,
    migration_required TEXT,
    last_position      INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS managed_filter (
    session_id       TEXT    NOT NULL,
    filter           TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    requested_qos    INTEGER,
    granted_qos      INTEGER,
    reason_code      INTEGER,
    since_position   INTEGER NOT NULL,
    updated_position INTEGER NOT NULL,
    PRIMARY KEY (session_id, filter)
);
