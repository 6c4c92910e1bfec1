-- A swap applies to everything the group has not consumed (ADR 0014).

-- The first log position the group was declared for (the topic head + 1 when it was first
-- declared); NULL until its first routing step fills it in (groups routed before this
-- migration: from their cursor at that step on, since older coverage was not recorded).
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS start_position BIGINT;
-- The install the group's routing state is aligned with (0: none yet). When the effective
-- install differs, the next routing step applies the swap first.
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS routed_install BIGINT NOT NULL DEFAULT 0;
-- After a swap the new install rescans what the log still holds up to where the old one had
-- routed (`rescan_until`), one batch per routing step beside the forward routing of new
-- messages; `rescan_position` is the next position to rescan. Rescanning asks, per message,
-- whether an earlier install already matched (and so delivered) it.
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS rescan_position BIGINT NOT NULL DEFAULT 1;
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS rescan_until BIGINT NOT NULL DEFAULT 0;

-- One row per install a group's routing was aligned with: its set, the log ranges routed under
-- it (forward from where the previous install stopped; rescanned from the oldest retained
-- message; the ends are filled in when the next install closes it), and what applying it did
-- to the deliveries routed under earlier ones.
CREATE TABLE IF NOT EXISTS route_generation (
    group_name       TEXT        NOT NULL,
    install          BIGINT      NOT NULL,
    patterns         TEXT[]      NOT NULL,
    from_position    BIGINT      NOT NULL,
    through_position BIGINT,
    rescan_from      BIGINT      NOT NULL,
    rescan_through   BIGINT,
    set_aside        BIGINT      NOT NULL,
    restored         BIGINT      NOT NULL,
    kept             BIGINT      NOT NULL,
    applied_at       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, install)
);

-- Deliveries routed under an earlier install that the install in effect does not match: never
-- claimable while it is in effect; an install that matches them again (a rollback) puts them
-- back. An ack by the claim that held one when it was set aside still settles it.
CREATE TABLE IF NOT EXISTS set_aside (
    group_name   TEXT        NOT NULL,
    topic        TEXT        NOT NULL,
    position     BIGINT      NOT NULL,
    routed_by    BIGINT      NOT NULL,
    routed_at    TIMESTAMPTZ NOT NULL,
    attempts     INTEGER     NOT NULL,
    visible_at   TIMESTAMPTZ NOT NULL,
    claimed_by   TEXT,
    claim_token  BIGINT,
    last_error   TEXT,
    set_aside_by BIGINT      NOT NULL,
    set_aside_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, position)
);
CREATE INDEX IF NOT EXISTS set_aside_topic ON set_aside (topic, position);
