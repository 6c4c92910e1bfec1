-- The HA lease of each exclusive MQTT session (see the Postgres twin for the meaning of each
-- column). `expires_at` is microseconds of the store's clock.
CREATE TABLE IF NOT EXISTS session_lease (
    session_id    TEXT    PRIMARY KEY,
    holder        TEXT,
    token         INTEGER NOT NULL,
    ttl_ms        INTEGER,
    expires_at    INTEGER,
    last_sequence INTEGER NOT NULL,
    last_position INTEGER NOT NULL
);
