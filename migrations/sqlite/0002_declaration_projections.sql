-- Projections of the declaration ledger (see the Postgres twin for the meaning of each table).
CREATE TABLE IF NOT EXISTS binding (
    group_name TEXT NOT NULL,
    pattern    TEXT NOT NULL,
    PRIMARY KEY (group_name, pattern)
);

CREATE TABLE IF NOT EXISTS effective_declaration (
    group_name  TEXT    PRIMARY KEY,
    topic       TEXT    NOT NULL,
    declarer    TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    patterns    TEXT    NOT NULL,
    previous    TEXT,
    declared_at INTEGER NOT NULL,
    attempt_at  INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    installs    INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS declarer_attempt (
    group_name  TEXT    NOT NULL,
    declarer    TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    patterns    TEXT    NOT NULL,
    incumbent   TEXT,
    declared_at INTEGER NOT NULL,
    attempt_at  INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    PRIMARY KEY (group_name, declarer)
);
