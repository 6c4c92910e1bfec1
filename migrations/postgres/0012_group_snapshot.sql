-- Group snapshots (ADR 0034): each consumer group's folded state as of a sequence of its
-- stream, so a cold load folds only the events after it. Derived data: rebuildable from the
-- events, never the source of truth. `state` is opaque to the store (text, not json: the store
-- never parses it); `format` names how it is written, and a build ignores a format it does not
-- know.
CREATE TABLE IF NOT EXISTS group_snapshot (
    group_name TEXT    PRIMARY KEY,
    sequence   BIGINT  NOT NULL,
    format     INTEGER NOT NULL,
    state      TEXT    NOT NULL
);
