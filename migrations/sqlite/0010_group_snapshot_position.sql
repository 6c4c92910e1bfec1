-- The position of the event a saved group state folds up to (ADR 0034's open end, closed here):
-- written with the state, compared on load. A stream whose event at that sequence now has
-- another position was restored or replaced since the state was saved, and the state is not
-- used. NULL (rows saved before this migration, or at a sequence with no event) checks nothing.
ALTER TABLE group_snapshot ADD COLUMN position INTEGER;
