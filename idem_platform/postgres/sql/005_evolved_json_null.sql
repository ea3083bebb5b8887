-- Evolved text columns: a JSON null is SQL NULL (as in a declared string column).
--
-- Until this version, the commit that added an evolved column (schema_contract: evolve)
-- stored a JSON null in it as the text 'null': indistinguishable from the string "null",
-- missed by IS NULL, and counted by `idem retype` as a failed cast. Coercion now keeps
-- the null; this repairs the rows already written. A value is set to NULL only where its
-- text is 'null' AND the row's _payload holds JSON null for that field, so a real string
-- "null" stays.
--
-- The catalog names the evolved columns (idem.catalog.columns[*].evolved). For big
-- tables: one UPDATE per table, whatever its number of evolved columns (one sequential
-- scan of it), which writes only the rows holding such a value; it takes no lock
-- beyond the row locks of those rows (reads and other writers go on), and a table
-- without any such row is scanned and left untouched. It runs once, inside the start-up
-- DDL transaction (see postgres/schema.py). A record type's table is found under either
-- name it may have: the record type itself (before table names spelt '-' as '_') or its
-- table name (idem."threat-actor", idem.threat_actor).
DO $$
DECLARE
    entry record;
    found text[];
    sets text;
    condition text;
BEGIN
    FOR entry IN
        SELECT c.record_type,
               coalesce(to_regclass(format('idem.%I', c.record_type)),
                        to_regclass(format('idem.%I', replace(c.record_type, '-', '_')))) AS oid,
               array_agg(col ->> 'name') AS names
        FROM idem.catalog c, jsonb_array_elements(c.columns) col
        WHERE jsonb_typeof(c.columns) = 'array' AND col ->> 'evolved' = 'true'
        GROUP BY c.record_type
        ORDER BY c.record_type
    LOOP
        CONTINUE WHEN entry.oid IS NULL;
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = entry.oid AND attname = '_payload' AND atttypid = 'jsonb'::regtype AND NOT attisdropped
        );
        SELECT array_agg(a.attname::text ORDER BY a.attnum) INTO found
        FROM pg_attribute a
        WHERE a.attrelid = entry.oid AND a.attname = ANY (entry.names)
          AND a.atttypid = 'text'::regtype AND NOT a.attisdropped;
        CONTINUE WHEN found IS NULL;
        SELECT string_agg(format('%1$I = CASE WHEN %1$I = ''null'' AND _payload -> %2$L = ''null''::jsonb '
                                 'THEN NULL ELSE %1$I END', name, name), ', '),
               string_agg(format('(%1$I = ''null'' AND _payload -> %2$L = ''null''::jsonb)', name, name), ' OR ')
        INTO sets, condition
        FROM unnest(found) AS name;
        EXECUTE format('UPDATE %s SET %s WHERE %s', entry.oid, sets, condition);
    END LOOP;
END
$$;
