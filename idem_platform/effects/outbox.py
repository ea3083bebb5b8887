"""The commit's share of outbound effects: one ``idem.outbox`` row per written row that qualifies.

Called once by the applying transaction, after every row of the commit is inserted and
before COMMIT: the rows this commit wrote are exactly those of ``idem.<record_type>``
whose ``_commit_id`` is the commit's (a skipped row keeps the commit that first wrote it,
a rejected one is in no table), found through the ``_commit_id`` index. So an effect
exists if and only if its row was committed, and a retry, a replayed file or a re-read
Kafka range, which write nothing, owe nothing. A run tagged as a replay counts what it
would have owed (``effects_suppressed``) and inserts none.

The minted key is computed in PostgreSQL, set-based, exactly as
:func:`~idem_platform.contract.keys.minted_key` computes it in Python (SHA-256 of the
4-byte big-endian part count, then each part's 4-byte big-endian UTF-8 length and
bytes); a null part is the empty text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import TableSpec
from idem_platform.effects.rule import OutboxRule
from idem_platform.postgres.schema import SCHEMA
from idem_platform.postgres.tables import table_ident

if TYPE_CHECKING:
    from idem_platform.write.plan import CommitPlan

# A key part or body field that is not a declared column: the row's system column.
SYSTEM_COLUMNS = {
    "connector": "_connector",
    "record_type": "_record_type",
    "external_id": "_external_id",
    "content_hash": "_content_hash",
    "record_key": "_idempotency_key",
}
_OPERATORS = {"equals": "=", "not_equals": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def write_outbox(conn: psycopg.Connection, plan: CommitPlan) -> dict[str, int]:
    """Insert the outbox rows this commit owes (inside its transaction); the summary's counts.

    Returns:
        ``{}`` when no effect is on a record type of the commit; else ``effects_created``
        and ``effects_suppressed`` (a replay's qualifying rows, none inserted).
    """
    rules = [rule for rule in plan.effects if rule.record_type in plan.tables]
    if not rules:
        return {}
    created = suppressed = 0
    for rule in rules:
        query, params = _qualifying(rule, plan.tables[rule.record_type], plan.commit_id)
        if plan.replay:
            row = conn.execute(sql.SQL("SELECT count(*) FROM ({}) q").format(query), params).fetchone()
            suppressed += int(row[0]) if row else 0
            continue
        insert = sql.SQL(
            "INSERT INTO {schema}.outbox (key, effect, connector, record_type, external_id, record_key, payload, commit_id) "
            "{query} ON CONFLICT (key) DO NOTHING"
        ).format(schema=sql.Identifier(SCHEMA), query=query)
        created += conn.execute(insert, params).rowcount
    return {"effects_created": created, "effects_suppressed": suppressed}


def _qualifying(rule: OutboxRule, spec: TableSpec, commit_id: str) -> tuple[sql.Composed, dict[str, Any]]:
    """The ``SELECT`` of the outbox rows ``rule`` makes of the commit's written rows, and its parameters."""
    columns = {c.name: c for c in spec.columns}
    params: dict[str, Any] = {"effect": rule.name, "commit_id": commit_id}
    conditions: list[sql.Composable] = [sql.SQL("t._commit_id = %(commit_id)s::uuid")]
    for index, (field, operator, value) in enumerate(rule.when):
        name = f"v{index}"
        cast = sql.SQL(columns[field].type.postgres)
        params[name] = list(value) if operator == "in" else value
        if operator == "in":
            test = sql.SQL("t.{} = ANY(%({})s::{}[])").format(sql.Identifier(field), sql.SQL(name), cast)
        else:
            test = sql.SQL("t.{} {} %({})s::{}").format(
                sql.Identifier(field), sql.SQL(_OPERATORS[operator]), sql.SQL(name), cast
            )
        conditions.append(test)
    body = sql.SQL(", ").join(
        sql.SQL("{}, to_jsonb(t.{})").format(sql.Literal(field), sql.Identifier(SYSTEM_COLUMNS.get(column, column)))
        for field, column in rule.body
    )
    query = sql.SQL(
        "SELECT {key}, %(effect)s, t._connector, t._record_type, t._external_id::text, t._idempotency_key, "
        "jsonb_build_object({body}), "
        "t._commit_id FROM {table} t WHERE {conditions}"
    ).format(
        key=minted_key_sql(rule.key),
        body=body,
        table=table_ident(rule.record_type),
        conditions=sql.SQL(" AND ").join(conditions),
    )
    return query, params


def minted_key_sql(parts: tuple[str, ...]) -> sql.Composed:
    """The SQL of a row ``t``'s minted key from named ``parts`` (``effect``: ``%(effect)s``)."""
    chunks: list[sql.Composable] = [sql.SQL("int4send({})").format(sql.Literal(len(parts)))]
    for part in parts:
        if part == "effect":
            value: sql.Composable = sql.SQL("%(effect)s::text")
        else:
            value = sql.SQL("t.{}::text").format(sql.Identifier(SYSTEM_COLUMNS.get(part, part)))
        encoded = sql.SQL("convert_to(coalesce({}, ''), 'UTF8')").format(value)
        chunks += [sql.SQL("int4send(octet_length({}))").format(encoded), encoded]
    return sql.SQL("encode(sha256({}), 'hex')").format(sql.SQL(" || ").join(chunks))
