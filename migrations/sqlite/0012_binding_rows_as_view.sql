-- The binding rows become a view over the effective declaration's patterns (ADR 0064; see the
-- Postgres twin, migration 0026). An install writes the patterns once, as the JSON array in
-- `effective_declaration.patterns`; `binding` derives one row per pattern on read. An older
-- build's writes of binding rows (the install's DELETE and INSERT, a rebuild's INSERT) are
-- absorbed by INSTEAD OF triggers that do nothing; its reads see the same columns.
DROP TABLE binding;

CREATE VIEW binding (group_name, pattern) AS
SELECT e.group_name, p.value
FROM effective_declaration e, json_each(e.patterns) p;

CREATE TRIGGER binding_insert_absorbed INSTEAD OF INSERT ON binding BEGIN SELECT 1; END;
CREATE TRIGGER binding_update_absorbed INSTEAD OF UPDATE ON binding BEGIN SELECT 1; END;
CREATE TRIGGER binding_delete_absorbed INSTEAD OF DELETE ON binding BEGIN SELECT 1; END;
