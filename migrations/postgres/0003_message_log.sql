-- The message log and per-group delivery (ADR 0007).

-- One row per topic; `head` is the last position assigned. A publish locks the row until it
-- commits, so positions are gapless and become visible in order.
CREATE TABLE IF NOT EXISTS topic (
    name       TEXT        PRIMARY KEY,
    head       BIGINT      NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE IF NOT EXISTS message (
    topic        TEXT        NOT NULL,
    position     BIGINT      NOT NULL,
    subject      TEXT        NOT NULL,
    payload      BYTEA       NOT NULL,
    headers      JSONB       NOT NULL DEFAULT '{}',
    published_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topic, position)
);

-- The routing cursor: the last log position this group has matched against its set. A new
-- group starts at the topic's head when it is first declared.
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS routed_position BIGINT NOT NULL DEFAULT 0;

-- A message routed to a group and not yet acknowledged. Claimable when visible_at has passed.
CREATE TABLE IF NOT EXISTS delivery (
    group_name  TEXT        NOT NULL,
    topic       TEXT        NOT NULL,
    position    BIGINT      NOT NULL,
    routed_by   BIGINT      NOT NULL,
    routed_at   TIMESTAMPTZ NOT NULL,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    visible_at  TIMESTAMPTZ NOT NULL,
    claimed_by  TEXT,
    claim_token BIGINT,
    last_error  TEXT,
    PRIMARY KEY (group_name, position)
) WITH (fillfactor = 70);
-- Claims walk the primary key in position order and skip rows whose visible_at lies ahead.
-- visible_at is deliberately not indexed: a claim then changes no indexed column, so Postgres
-- updates the row in place (HOT, with the fillfactor's free space) instead of writing new index
-- entries for every claim.

-- Messages a group gave up on after max attempts; a full copy, so log retention never loses
-- them, and they can be replayed.
CREATE TABLE IF NOT EXISTS dead_letter (
    group_name   TEXT        NOT NULL,
    topic        TEXT        NOT NULL,
    position     BIGINT      NOT NULL,
    subject      TEXT        NOT NULL,
    payload      BYTEA       NOT NULL,
    headers      JSONB       NOT NULL,
    published_at TIMESTAMPTZ NOT NULL,
    attempts     INTEGER     NOT NULL,
    last_error   TEXT,
    dead_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_name, position)
);
