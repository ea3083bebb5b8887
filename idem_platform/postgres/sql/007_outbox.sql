-- Outbound effects (DESIGN §9): one row per effect owed, inserted by the commit that wrote its
-- record (same transaction), delivered by `idem effects deliver` under its minted key.
CREATE TABLE IF NOT EXISTS idem.outbox (
    key              text PRIMARY KEY,              -- the minted key: Idempotency-Key on every attempt
    effect           text NOT NULL,
    connector        text NOT NULL,
    record_type      text NOT NULL,
    record_key       text NOT NULL,                 -- the row's _idempotency_key
    payload          jsonb NOT NULL,                -- the request body
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by       text,                          -- the dispatcher holding the lease
    claimed_until    timestamptz,                   -- after this, another dispatcher takes it over
    last_status      integer,                       -- the receiver's last HTTP status (null: no answer)
    last_response    text,                          -- the last answer or error, at most 2,000 characters
    reason           text,                          -- why a failed row was parked
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    delivered_at     timestamptz,
    commit_id        uuid NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_due ON idem.outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_effect_status ON idem.outbox (effect, status);
