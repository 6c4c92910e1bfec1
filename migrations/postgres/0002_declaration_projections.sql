-- Projections of the declaration ledger. Every value here is derived from events only, so a
-- rebuild reproduces these tables exactly.

-- Inline: the effective binding rows, written only by the install/swap transaction. A group
-- with no rows reads as the whole topic.
CREATE TABLE IF NOT EXISTS binding (
    group_name TEXT NOT NULL,
    pattern    TEXT NOT NULL,
    PRIMARY KEY (group_name, pattern)
);

-- Inline: each group's effective (newest installed) declaration.
CREATE TABLE IF NOT EXISTS effective_declaration (
    group_name  TEXT        PRIMARY KEY,
    topic       TEXT        NOT NULL,
    declarer    TEXT        NOT NULL,
    version     TEXT        NOT NULL,
    patterns    TEXT[]      NOT NULL,
    previous    TEXT[],
    declared_at TIMESTAMPTZ NOT NULL,
    attempt_at  TIMESTAMPTZ NOT NULL,
    position    BIGINT      NOT NULL,
    installs    BIGINT      NOT NULL
);

-- Catch-up: each declarer's newest attempt per group (the listing's waiters).
CREATE TABLE IF NOT EXISTS declarer_attempt (
    group_name  TEXT        NOT NULL,
    declarer    TEXT        NOT NULL,
    status      TEXT        NOT NULL,
    version     TEXT        NOT NULL,
    patterns    TEXT[]      NOT NULL,
    incumbent   TEXT[],
    declared_at TIMESTAMPTZ NOT NULL,
    attempt_at  TIMESTAMPTZ NOT NULL,
    position    BIGINT      NOT NULL,
    PRIMARY KEY (group_name, declarer)
);
