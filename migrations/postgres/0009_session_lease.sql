-- The HA lease of each exclusive MQTT session (ADR 0028, ADR 0030). Inline projection of the
-- `session_lease` stream: one row per durable session identity whose lease was ever touched.
-- The fencing guard of every ledger write made on behalf of an exclusive session reads it in
-- the write's own lock statement (holder, token and expiry by the store's clock).
CREATE TABLE IF NOT EXISTS session_lease (
    session_id    TEXT        PRIMARY KEY,
    -- The owner (NULL: free, released or its expiry was observed).
    holder        TEXT,
    -- The owner's token; when free, the last token issued (0 before the first acquire).
    token         BIGINT      NOT NULL,
    -- The owner's TTL in milliseconds and its expiry (NULL when free).
    ttl_ms        BIGINT,
    expires_at    TIMESTAMPTZ,
    -- The lease stream's newest sequence and ledger position: the row is the fold of the
    -- stream up to `last_sequence`, so a process can start deciding from it.
    last_sequence BIGINT      NOT NULL,
    last_position BIGINT      NOT NULL
);
