-- The `binding` view's INSTEAD OF trigger (ADR 0064): an older build's write of a binding row
-- changes nothing; the patterns in `effective_declaration` are the truth.
CREATE OR REPLACE FUNCTION wharf_binding_write_absorbed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- An older build's write of a binding row: its array in effective_declaration is the truth.
    RETURN NULL;
END
$$;
