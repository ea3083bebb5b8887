"""The ``INSERT … SELECT`` that moves one attempt's staged rows of a record type into its table."""

from __future__ import annotations

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import Column, TableSpec
from idem_platform.postgres.retype import promote_cast
from idem_platform.postgres.tables import table_ident
from idem_platform.write.apply.evolution import Evolution
from idem_platform.write.plan import CommitPlan


def insert_rows(
    conn: psycopg.Connection,
    plan: CommitPlan,
    record_type: str,
    spec: TableSpec,
    stage: sql.Composed,
    evolution: Evolution,
    *,
    unique_keys: bool = False,
    on_conflict: bool = False,
    promoted: dict[str, Column] | None = None,
) -> int:
    typed = [c.name for c in spec.columns]
    # Promoted text columns (idem promote): their typed companions, filled from the
    # same text by the safe cast the backfill uses (NULL when it does not cast).
    promoted = promoted or {}
    companions = [c for c in typed + evolution.fill if c in promoted]
    target = [
        "_idempotency_key", "_connector", "_record_type", "_external_id", "_content_hash",
        "_schema_version", "_commit_id", "_ingested_at", "_source", "_payload",
    ] + typed + evolution.fill + ["props"] + ([plan.meta_column] if plan.meta_column else [])
    target += [str(promoted[c].typed_column) for c in companions]
    props = sql.SQL("s._props")
    if evolution.to_props:
        props = sql.SQL(
            "CASE WHEN s._extra ?| %(overcap)s THEN coalesce(s._props, '{}'::jsonb) || "
            "(SELECT jsonb_object_agg(k, coalesce(s._upgraded, s._payload) -> k) FROM jsonb_object_keys(s._extra) k "
            "WHERE k = ANY(%(overcap)s)) ELSE s._props END"
        )
    select: list[sql.Composable] = [
        # A record older than its table keeps its own version (_version) and its payload as
        # received; its typed values are those of the record upgraded by the migrations.
        sql.SQL("s._idempotency_key, %(connector)s, %(record_type)s, s._external_id, s._content_hash, "
                "coalesce(s._version, %(version)s), %(commit_id)s::uuid, now(), s._source, s._payload")
    ]
    select += [
        sql.SQL("NULLIF(coalesce(s._upgraded, s._payload) -> {}, 'null'::jsonb)").format(sql.Literal(c.name))
        if c.type.kind == "dynamic"
        else sql.SQL("s.{}").format(sql.Identifier(c.name))
        for c in spec.columns
    ]
    select += [sql.SQL("s._extra ->> {}").format(sql.Literal(name)) for name in evolution.fill]
    select.append(props)
    if plan.meta_column:
        select.append(sql.SQL("s._meta"))
    fills = set(evolution.fill) - set(typed)
    select += [
        sql.SQL("{}({})").format(
            promote_cast(promoted[c]),
            sql.SQL("s._extra ->> {}").format(sql.Literal(c)) if c in fills else sql.SQL("s.{}").format(sql.Identifier(c)),
        )
        for c in companions
    ]
    # First occurrence per key wins. An attempt whose executor vouched for distinct
    # keys needs no sort of its wide rows; the anti-join alone skips keys already
    # in the table (committed, or promoted from an earlier slice of this commit).
    first_per_key = sql.SQL("") if unique_keys else sql.SQL(" ORDER BY s._idempotency_key, s._pos")
    statement = sql.SQL(
        "INSERT INTO {target} ({columns}) "
        "SELECT {distinct}{select} FROM {stage} s "
        "WHERE NOT EXISTS "
        "(SELECT 1 FROM {target} t WHERE t._idempotency_key = s._idempotency_key)"
        "{order}{conflict}"
    ).format(
        # Another writer's keys, committed after this statement's snapshot or not yet
        # committed: wait for it and skip them (only after streaming met a conflict).
        conflict=sql.SQL(" ON CONFLICT (_idempotency_key) DO NOTHING") if on_conflict else sql.SQL(""),
        distinct=sql.SQL("") if unique_keys else sql.SQL("DISTINCT ON (s._idempotency_key) "),
        order=first_per_key,
        target=table_ident(record_type),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in target),
        select=sql.SQL(", ").join(select),
        stage=stage,
    )
    params = {
        "connector": plan.connector,
        "record_type": record_type,
        "version": spec.schema_version,
        "commit_id": plan.commit_id,
        "overcap": evolution.to_props,
    }
    return conn.execute(statement, params).rowcount
