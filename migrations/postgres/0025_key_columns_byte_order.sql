-- The key columns of the projection and queue tables compare in byte order (ADR 0062).
--
-- Until here they had the database's collation. Where that is a libc or ICU locale (even
-- `C.UTF-8`, which Postgres 15 does not treat as "C"), every comparison of a key in an index
-- descent, a sort or a `>` cursor goes through the locale's comparison: measured on a 10k-group
-- store, the listing calls spent 11-18% of their server time there. And a locale such as
-- `en_US` orders `a_b` before `aB`, where SQLite, Rust and a byte-order cursor do not: the same
-- page would list in another order on each backend.
--
-- Each column below becomes `COLLATE "C"`, where it is not already. The column's type and
-- values do not change and the table is not rewritten; each index on the column is rebuilt,
-- under the table's exclusive lock, for as long as that takes (`docs/runbooks/cluster-mode.md`:
-- about a second per few hundred thousand rows on the development machine). A parameter
-- compared with such a column takes the column's collation, so every statement keeps its
-- index; the ledger's own keys (`events`, `snapshots`, `aggregate_lock`, `group_snapshot`,
-- which is compared with `events`) and the sessions' tables keep the database's collation and
-- are never compared with these columns by an index. Written to run twice: a column already
-- in byte order is left alone.
DO $$
DECLARE
    key RECORD;
BEGIN
    FOR key IN
        SELECT k.tab, k.col
        FROM (VALUES
            ('binding', 'group_name'),
            ('consumer_group', 'group_name'),
            ('consumer_group', 'topic'),
            ('dead_letter', 'group_name'),
            ('dead_letter', 'topic'),
            ('declarer_attempt', 'group_name'),
            ('declarer_attempt', 'declarer'),
            ('delivery', 'group_name'),
            ('delivery', 'topic'),
            ('effective_declaration', 'group_name'),
            ('effective_declaration', 'topic'),
            ('effective_declaration', 'declarer'),
            ('message', 'topic'),
            ('open_wait', 'group_name'),
            ('open_wait', 'declarer'),
            ('projection_checkpoint', 'projector'),
            ('route_generation', 'group_name'),
            ('set_aside', 'group_name'),
            ('set_aside', 'topic'),
            ('topic', 'name'),
            ('waiting_group', 'group_name'),
            ('worker_instance', 'group_name'),
            ('worker_instance', 'topic'),
            ('worker_instance', 'declarer')
        ) AS k (tab, col)
        JOIN pg_attribute a
          ON a.attrelid = to_regclass(quote_ident(k.tab)) AND a.attname = k.col
        WHERE a.attcollation <> 'pg_catalog."C"'::regcollation
        ORDER BY k.tab, k.col
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I TYPE text COLLATE "C"', key.tab, key.col);
    END LOOP;
END
$$;
