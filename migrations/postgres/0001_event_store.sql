-- Wharf event store (Postgres). The `events` columns follow postgres-es's layout so cqrs-es
-- tooling can read the ledger; `position`, `recorded_at` are Wharf's additions (defaulted, so a
-- postgres-es INSERT that names only its own columns still works).
CREATE TABLE IF NOT EXISTS events (
    aggregate_type TEXT        NOT NULL,
    aggregate_id   TEXT        NOT NULL,
    sequence       BIGINT      NOT NULL,
    event_type     TEXT        NOT NULL,
    event_version  TEXT        NOT NULL,
    payload        JSON        NOT NULL,
    metadata       JSON        NOT NULL,
    position       BIGINT      GENERATED ALWAYS AS IDENTITY UNIQUE,
    recorded_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (aggregate_type, aggregate_id, sequence)
);
CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at);

-- postgres-es expects a snapshots table; Wharf does not snapshot (see ADR 0003) but keeps the
-- layout complete for interoperability.
CREATE TABLE IF NOT EXISTS snapshots (
    aggregate_type   TEXT   NOT NULL,
    aggregate_id     TEXT   NOT NULL,
    last_sequence    BIGINT NOT NULL,
    current_snapshot BIGINT NOT NULL,
    payload          JSON   NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- One row per catch-up projector: the last position it has applied.
CREATE TABLE IF NOT EXISTS projection_checkpoint (
    projector  TEXT   PRIMARY KEY,
    position   BIGINT NOT NULL DEFAULT 0
);

-- The consumer-group row: the lock that serializes a group's declaration attempts.
CREATE TABLE IF NOT EXISTS consumer_group (
    group_name TEXT        PRIMARY KEY,
    topic      TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Worker instances: state, not events. A heartbeat fresher than the TTL (by this database's
-- clock) makes an instance a live declarer of `patterns`.
CREATE TABLE IF NOT EXISTS worker_instance (
    group_name   TEXT        NOT NULL,
    declarer     TEXT        NOT NULL,
    topic        TEXT        NOT NULL,
    version      TEXT        NOT NULL,
    patterns     TEXT[]      NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, declarer)
);
