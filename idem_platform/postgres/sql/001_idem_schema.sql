-- The idem schema (DESIGN §4): ledger, commits, offsets, rejects, execution log, catalog.
CREATE SCHEMA IF NOT EXISTS idem;
CREATE SCHEMA IF NOT EXISTS idem_staging;

CREATE TABLE idem.ingest_ledger (
    namespace    text        NOT NULL,
    key          text        NOT NULL,
    request_hash text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('in_progress', 'committed', 'failed')),
    result       jsonb,
    error        jsonb,
    attempts     integer     NOT NULL DEFAULT 1,
    owner        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX ingest_ledger_expires_at ON idem.ingest_ledger (expires_at);

CREATE TABLE idem.commits (
    commit_id       uuid        PRIMARY KEY,
    run_id          text,
    connector       text        NOT NULL,
    started_at      timestamptz NOT NULL,
    committed_at    timestamptz NOT NULL DEFAULT now(),
    rows_written    bigint      NOT NULL DEFAULT 0,
    rows_skipped    bigint      NOT NULL DEFAULT 0,
    rows_rejected   bigint      NOT NULL DEFAULT 0,
    replay          boolean     NOT NULL DEFAULT false,
    sources         jsonb       NOT NULL DEFAULT '[]',
    valid_through   timestamptz,
    schema_versions jsonb       NOT NULL DEFAULT '{}',
    tables          jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX commits_connector_committed_at ON idem.commits (connector, committed_at);

CREATE TABLE idem.source_offsets (
    connector   text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    commit_id   uuid    NOT NULL,
    PRIMARY KEY (connector, topic, partition)
);

CREATE TABLE idem.rejects (
    reject_id   bigserial   PRIMARY KEY,
    commit_id   uuid        NOT NULL,
    connector   text        NOT NULL,
    source      text        NOT NULL,
    position    text        NOT NULL,
    line        bigint,
    raw         text        NOT NULL,
    raw_length  bigint      NOT NULL,
    reasons     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejects_commit_id ON idem.rejects (commit_id);
CREATE INDEX rejects_connector ON idem.rejects (connector, created_at);

CREATE TABLE idem.execution_log (
    commit_id  uuid   NOT NULL,
    event_type text   NOT NULL CHECK (event_type IN ('written', 'idempotent_skip', 'replay_skip', 'rejected')),
    count      bigint NOT NULL,
    PRIMARY KEY (commit_id, event_type)
);

CREATE TABLE idem.catalog (
    record_type    text        PRIMARY KEY,
    schema_version integer     NOT NULL,
    columns        jsonb       NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
