-- The binding rows become a view over the effective declaration's patterns (ADR 0064).
--
-- Every install used to write the group's patterns twice in its transaction: as the array in
-- `effective_declaration.patterns`, which the router and the claim read, and as one `binding`
-- row per pattern, which only `ReadModel::effective_bindings`, `projections rebuild --verify`
-- and tests read. The rows cost the register about a seventh of its statement's throughput
-- (pgbench, docs/benchmarks.md). From here `binding` is derived on read from the array, so it
-- can never disagree with what claims use.
--
-- Not additive, but older builds keep working (ADR 0017's purpose): their reads of `binding`
-- see the same columns, now always current; their writes (the install's DELETE and
-- INSERT ... ON CONFLICT DO NOTHING, the rebuild's COPY) are absorbed by an INSTEAD OF trigger
-- that does nothing, because the array they also write is the source. Their `projections
-- rebuild` already refuses on a newer schema. The table's rows are dropped: they held nothing
-- the array does not. Written to run twice: a `binding` that is already the view stays.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('binding') AND relkind = 'r') THEN
        DROP TABLE binding;
    END IF;
END
$$;

CREATE OR REPLACE VIEW binding AS
SELECT e.group_name, p.pattern
FROM effective_declaration e
CROSS JOIN LATERAL unnest(e.patterns) AS p (pattern);

-- include: functions/wharf_binding_write_absorbed.sql fnv1a64=08fe5c4fca62876f

DROP TRIGGER IF EXISTS binding_write_absorbed ON binding;
CREATE TRIGGER binding_write_absorbed
INSTEAD OF INSERT OR UPDATE OR DELETE ON binding
FOR EACH ROW EXECUTE FUNCTION wharf_binding_write_absorbed();
