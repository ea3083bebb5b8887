"""The commit's share of outbound effects: one ``idem.outbox`` row per written row that qualifies.

Called once by the applying transaction, after every row of the commit is inserted (and
every upsert table's current state folded) and before COMMIT: the rows this commit wrote are exactly those of ``idem.<record_type>``
whose ``_commit_id`` is the commit's (a skipped row keeps the commit that first wrote it,
a rejected one is in no table), found through the ``_commit_id`` index. So an effect
exists if and only if its row was committed, and a retry, a replayed file or a re-read
Kafka range, which write nothing, owe nothing. A run tagged as a replay counts what it
would have owed (``effects_suppressed``) and inserts none.

An upsert table's effect fires on what the commit did to the current state instead: its
rows are the versions this commit wrote that the state now names (the batch's winner per
identity that beat the state's version), each with its change (``deleted`` when it is a
tombstone, ``inserted`` when the fold gave its identity a first row, else ``updated``).
A stale version, and one superseded within the batch, is in the history only and owes
nothing; a rebuild of the state folds without this module and owes nothing either.

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
from idem_platform.postgres.current import CurrentCounts, state_ident
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
    "change": "_change",
}
_OPERATORS = {"equals": "=", "not_equals": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def write_outbox(
    conn: psycopg.Connection, plan: CommitPlan, current: dict[str, CurrentCounts] | None = None
) -> dict[str, int]:
    """Insert the outbox rows this commit owes (inside its transaction); the summary's counts.

    ``current``: what folding the commit's versions did, per upsert table (its ``fresh``
    record keys tell an inserted identity from an updated one).

    Returns:
        ``{}`` when no effect is on a record type of the commit; else ``effects_created``
        and ``effects_suppressed`` (a replay's qualifying rows, none inserted).
    """
    rules = [rule for rule in plan.effects if rule.record_type in plan.tables]
    if not rules:
        return {}
    created = suppressed = 0
    for rule in rules:
        fresh = (current or {}).get(rule.record_type, CurrentCounts()).fresh
        query, params = _qualifying(rule, plan.tables[rule.record_type], plan.commit_id, fresh)
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


def _qualifying(
    rule: OutboxRule, spec: TableSpec, commit_id: str, fresh: frozenset[str] = frozenset()
) -> tuple[sql.Composed, dict[str, Any]]:
    """The ``SELECT`` of the outbox rows ``rule`` makes of the commit's written rows, and its parameters."""
    columns = {c.name: c for c in spec.columns}
    params: dict[str, Any] = {"effect": rule.name, "commit_id": commit_id}
    conditions: list[sql.Composable] = [sql.SQL("t._commit_id = %(commit_id)s::uuid")]
    source: sql.Composable = table_ident(rule.record_type)
    if rule.on_change and spec.upsert is not None:
        source = _changes(spec)
        params.update(fresh=sorted(fresh), on_change=list(rule.on_change))
        conditions.append(sql.SQL("t._change = ANY(%(on_change)s::text[])"))
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
        table=source,
        conditions=sql.SQL(" AND ").join(conditions),
    )
    return query, params


def _changes(spec: TableSpec) -> sql.Composed:
    """An upsert table's history rows of commit ``%(commit_id)s`` that its state names now,
    each with ``_change``: found by the history's ``_commit_id`` index, then the state's
    primary key (the identity), so the cost follows the batch, not the table."""
    assert spec.upsert is not None  # the caller checks
    same = sql.SQL(" AND ").join(
        sql.SQL("s.{0} = h.{0}").format(sql.Identifier(name)) for name in spec.upsert.identity
    )
    return sql.SQL(
        "(SELECT h.*, CASE WHEN s._deleted THEN 'deleted' WHEN h._idempotency_key = ANY(%(fresh)s::text[]) "
        "THEN 'inserted' ELSE 'updated' END AS _change FROM {history} h JOIN {state} s ON {same} "
        "AND s._record_key = h._idempotency_key WHERE h._commit_id = %(commit_id)s::uuid)"
    ).format(history=table_ident(spec.record_type), state=state_ident(spec.record_type), same=same)


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
