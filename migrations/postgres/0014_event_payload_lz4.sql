-- New event payloads are TOAST-compressed with lz4 instead of pglz (ADR 0043). A managed
-- session's large events (a SUBACK record of 10,000 outcomes is ~1 MB of JSON) spent half of
-- their insert in pglz: in psql on the benchmark machine an insert of the 1 MB payload took
-- 19.5 ms with pglz and 9 ms with lz4, for a stored size of 74 KB against 84 KB; reads
-- decompress faster too. Only values written from now on change; old ones stay pglz and are
-- read as before. A server built without lz4 keeps pglz: the migration still succeeds.
-- Additive: nothing reads the compression method.
DO $$
BEGIN
    ALTER TABLE events ALTER COLUMN payload SET COMPRESSION lz4;
    ALTER TABLE snapshots ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not available on this server: event payloads stay pglz-compressed';
END
$$;
