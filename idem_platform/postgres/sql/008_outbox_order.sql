-- Ordering per identity and results as data (DESIGN §9).
-- seq: the commit order of outbox rows. The applying transaction holds its target table's
-- lock until COMMIT, so two commits of one record type insert in commit order and a later
-- version of an identity always gets a higher seq. Rows written before this version get
-- seq in created_at order.
-- external_id: the identity (effect, record_type, external_id) the dispatcher keeps in
-- order; null on rows written before this version (those are not ordered).
CREATE SEQUENCE IF NOT EXISTS idem.outbox_seq;
ALTER TABLE idem.outbox ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE idem.outbox ADD COLUMN IF NOT EXISTS external_id text;
UPDATE idem.outbox o SET seq = n.seq
FROM (SELECT key, nextval('idem.outbox_seq') AS seq FROM (SELECT key FROM idem.outbox ORDER BY created_at, key) k) n
WHERE o.key = n.key AND o.seq IS NULL;
ALTER TABLE idem.outbox ALTER COLUMN seq SET DEFAULT nextval('idem.outbox_seq');
ALTER TABLE idem.outbox ALTER COLUMN seq SET NOT NULL;
ALTER SEQUENCE idem.outbox_seq OWNED BY idem.outbox.seq;
-- The claim's "no earlier pending row of this identity" probe, and its "one claimed at a time".
CREATE INDEX IF NOT EXISTS outbox_identity ON idem.outbox (effect, record_type, external_id, seq)
    WHERE status = 'pending';
