-- The message log and per-group delivery (see the Postgres twin and ADR 0007).
CREATE TABLE IF NOT EXISTS topic (
    name       TEXT    PRIMARY KEY,
    head       INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS message (
    topic        TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    subject      TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{}',
    published_at INTEGER NOT NULL,
    PRIMARY KEY (topic, position)
) WITHOUT ROWID;

ALTER TABLE consumer_group ADD COLUMN routed_position INTEGER NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS delivery (
    group_name  TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    position    INTEGER NOT NULL,
    routed_by   INTEGER NOT NULL,
    routed_at   INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    visible_at  INTEGER NOT NULL,
    claimed_by  TEXT,
    claim_token INTEGER,
    last_error  TEXT,
    PRIMARY KEY (group_name, position)
) WITHOUT ROWID;
-- Claims walk the primary key in position order, as on Postgres.

CREATE TABLE IF NOT EXISTS dead_letter (
    group_name   TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    subject      TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    published_at INTEGER NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    dead_at      INTEGER NOT NULL,
    PRIMARY KEY (group_name, position)
) WITHOUT ROWID;
