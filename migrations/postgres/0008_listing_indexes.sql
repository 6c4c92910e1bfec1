-- Indexes of the paged listing (ADR 0024). Additive: older builds ignore them.

-- A topic filter walks the topic's groups by name from the cursor.
CREATE INDEX IF NOT EXISTS effective_declaration_topic ON effective_declaration (topic, group_name);

-- Open waiters: one group's waiting attempts by (first statement, declarer), the key their
-- pages walk; also what an install's "resolve the waiters of my set" reads, so that touches
-- the group's waiting rows only, never its resolved or installed ones.
CREATE INDEX IF NOT EXISTS declarer_attempt_waiting
    ON declarer_attempt (group_name, declared_at, declarer) WHERE status = 'waiting';
