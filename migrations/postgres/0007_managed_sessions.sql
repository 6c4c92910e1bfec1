-- Managed MQTT sessions (ADR 0022, ADR 0026).

-- The lock row of an aggregate with no row of its own (the locked executor's default lock):
-- an attempt upserts it, which takes the row lock and bumps `version`.
CREATE TABLE IF NOT EXISTS aggregate_lock (
    aggregate_type TEXT   NOT NULL,
    aggregate_id   TEXT   NOT NULL,
    version        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- One row per durable session identity whose managed-filter history is known (a baseline was
-- seeded). No row: the history is unknown and startup fails closed. Inline projection of the
-- `managed_session` stream.
CREATE TABLE IF NOT EXISTS managed_session (
    session_id         TEXT        PRIMARY KEY,
    baseline_source    TEXT        NOT NULL,
    -- Why the session is in the terminal migration-required state (NULL: it is not).
    migration_required TEXT,
    last_position      BIGINT      NOT NULL
);

-- The exact filters that may exist at the broker for a session: seeded, remembered before a
-- SUBSCRIBE, and kept until an UNSUBACK said 0x00 or 0x11 and the removal was verified.
CREATE TABLE IF NOT EXISTS managed_filter (
    session_id       TEXT        NOT NULL,
    filter           TEXT        NOT NULL,
    -- 'seeded' | 'remembered' | 'granted' | 'refused'
    state            TEXT        NOT NULL,
    requested_qos    SMALLINT,
    granted_qos      SMALLINT,
    reason_code      SMALLINT,
    since_position   BIGINT      NOT NULL,
    updated_position BIGINT      NOT NULL,
    PRIMARY KEY (session_id, filter)
);
