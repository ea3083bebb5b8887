-- Upsert tables (mode: upsert): what each commit's written versions did to the current
-- state is logged beside the record counts: upsert_inserted, upsert_updated,
-- upsert_deleted and upsert_stale (summed over the commit's upsert tables; they split
-- its `written` count of those tables, they do not add to it).
ALTER TABLE idem.execution_log DROP CONSTRAINT IF EXISTS execution_log_event_type_check;
ALTER TABLE idem.execution_log ADD CONSTRAINT execution_log_event_type_check CHECK (
    event_type IN ('written', 'idempotent_skip', 'replay_skip', 'rejected',
                   'upsert_inserted', 'upsert_updated', 'upsert_deleted', 'upsert_stale')
);
