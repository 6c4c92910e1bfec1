-- A swap applies to everything the group has not consumed (see the Postgres twin, ADR 0014).
ALTER TABLE consumer_group ADD COLUMN start_position INTEGER;
ALTER TABLE consumer_group ADD COLUMN routed_install INTEGER NOT NULL DEFAULT 0;
ALTER TABLE consumer_group ADD COLUMN rescan_position INTEGER NOT NULL DEFAULT 1;
ALTER TABLE consumer_group ADD COLUMN rescan_until INTEGER NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS route_generation (
    group_name       TEXT    NOT NULL,
    install          INTEGER NOT NULL,
    patterns         TEXT    NOT NULL,
    from_position    INTEGER NOT NULL,
    through_position INTEGER,
    rescan_from      INTEGER NOT NULL,
    rescan_through   INTEGER,
    set_aside        INTEGER NOT NULL,
    restored         INTEGER NOT NULL,
    kept             INTEGER NOT NULL,
    applied_at       INTEGER NOT NULL,
    PRIMARY KEY (group_name, install)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS set_aside (
    group_name   TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    routed_by    INTEGER NOT NULL,
    routed_at    INTEGER NOT NULL,
    attempts     INTEGER NOT NULL,
    visible_at   INTEGER NOT NULL,
    claimed_by   TEXT,
    claim_token  INTEGER,
    last_error   TEXT,
    set_aside_by INTEGER NOT NULL,
    set_aside_at INTEGER NOT NULL,
    PRIMARY KEY (group_name, position)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS set_aside_topic ON set_aside (topic, position);
