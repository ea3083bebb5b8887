-- The quarantine loop (`idem rejects retry`): a reject is never deleted. A retry that
-- commits it marks it (retried_commit_id, retried_at); one that finds it still failing
-- leaves it quarantined and records what it said (last_retry_*), and against what:
-- last_retry_digest = md5(<catalog digest> || ':' || md5(raw)), so a later retry
-- skips it until the catalog (or the raw text) changes. The partial index serves the
-- retry's selection: a connector's rejects not retried yet.
ALTER TABLE idem.rejects
    ADD COLUMN retried_commit_id    uuid,
    ADD COLUMN retried_at           timestamptz,
    ADD COLUMN retries              integer NOT NULL DEFAULT 0,
    ADD COLUMN last_retry_commit_id uuid,
    ADD COLUMN last_retried_at      timestamptz,
    ADD COLUMN last_retry_reasons   jsonb,
    ADD COLUMN last_retry_digest    text;
CREATE INDEX rejects_pending ON idem.rejects (connector, commit_id) WHERE retried_commit_id IS NULL;
CREATE INDEX rejects_last_retry_commit_id ON idem.rejects (last_retry_commit_id) WHERE last_retry_commit_id IS NOT NULL;
