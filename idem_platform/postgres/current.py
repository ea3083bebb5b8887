"""The current state of an upsert table (``mode: upsert``): one row per identity, order-safe.

Beside the history ``idem.<type>`` (every distinct version once, keyed by record key, as
for any table), an upsert table has:

* ``idem.<type>_state``: one narrow row per identity (its primary key): the order and
  content hash of the version that is current, that version's record key, whether it is a
  delete (``_deleted``: a tombstone) and the commit that made it current;
* ``idem.<type>_current``: a view of the history rows the live state rows name (every
  column of the history, one row per identity), which is what readers query.

The state holds no copy of the payload and typed columns: a version's row is in the
history already, so the state's upsert writes a few narrow columns per identity, and the
history's new columns (schema evolution, ``idem retype``) reach the view when it is
replaced (:func:`refresh_current_view`), without a second table to widen.

**The guard.** The state is a fold of the history: per identity, the version with the
greatest ``(order, content hash, record key)``. A commit folds in the versions it wrote
(history rows of its ``_commit_id``), in its own transaction: per identity the batch's
greatest version first (``DISTINCT ON``), then ``INSERT … ON CONFLICT (identity) DO UPDATE
… WHERE (excluded's order, hash, key) > (the state's)``. A version already in the history
was folded in by the commit that wrote it, so replays, repeats and any arrival order give
the same state. A delete is a version like any other, kept as a tombstone: an older
version arriving later loses to it, a newer one wins.

**The order** is the ``order_by`` column's value, a Debezium event's source position
(``ARRAY[source.lsn]``, or ``ARRAY[binlog file number, pos, row]`` of a MySQL event), or, on
a table without ``order_by``, the source's own order: ``_source_order``, ``ARRAY[commit
number, position in the commit]``, which the commit writes beside each version it inserts
(:mod:`idem_platform.write.apply.rows`); arrays compare element by element.

A state table is derived data: when its definition (identity, order, delete rule) differs
from the config's, it is rebuilt from the history; when the table goes back to append
mode it is dropped. Its comment records the definition it was built for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import (
    BINLOG_FILE_NUMBER,
    EXTERNAL_ID,
    SOURCE_ORDER,
    SOURCE_POSITION,
    TableSpec,
    UpsertSpec,
    table_name,
    upsert_relations,
)
from idem_platform.errors import ConfigError
from idem_platform.postgres.schema import SCHEMA, qualified_table_name

_MARK = "idem upsert state of "  # the state table's comment starts so, then the definition's JSON


def _ident(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(name))


def state_ident(record_type: str) -> sql.Composed:
    """``idem."<type>_state"``."""
    return _ident(upsert_relations(record_type)[0])


def current_ident(record_type: str) -> sql.Composed:
    """``idem."<type>_current"``."""
    return _ident(upsert_relations(record_type)[1])


@dataclass(frozen=True)
class CurrentCounts:
    """What folding a commit's versions into the state did, per upsert table.

    ``inserted``: identities that got their first row; ``updated``: a live version replaced
    the identity's row (a newer version, or one after a delete); ``deleted``: a delete
    became the identity's row; ``stale``: versions written to the history only (older than
    the identity's current one, or not the batch's greatest)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    # The record keys of the versions that gave an identity its first row (inserted), kept
    # only when asked (an effect tells inserted from updated by them); not a count.
    fresh: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, int]:
        return {"inserted": self.inserted, "updated": self.updated, "deleted": self.deleted, "stale": self.stale}


def _definition(spec: TableSpec, upsert: UpsertSpec) -> str:
    """What the state was built for, as the state table's comment records it."""
    definition: dict[str, object] = {
        "record_type": spec.record_type,
        "identity": [[name, _postgres_type(spec, name)] for name in upsert.identity],
        "order_by": [upsert.order_by, _postgres_type(spec, upsert.order_by)],
        "delete_when": [upsert.delete_field, upsert.delete_equals],
    }
    if upsert.debezium:
        definition["format"] = "debezium"
    return _MARK + json.dumps(definition, sort_keys=True)


# The change event in ``_payload`` (alias ``h``): inside the JSON converter's {schema, payload}
# wrapper or not, by the rule of idem_platform.coercion.rules.debezium_envelope.
_ENVELOPE = (
    "(CASE WHEN h._payload ? 'schema' AND jsonb_typeof(h._payload -> 'payload') = 'object' "
    "THEN h._payload -> 'payload' ELSE h._payload END)"
)


def debezium_envelope_sql() -> sql.SQL:
    """The Debezium change event of history row ``h`` (its ``_payload`` is the message as received)."""
    return sql.SQL(_ENVELOPE)


def _order_and_delete(upsert: UpsertSpec) -> tuple[sql.Composable, sql.Composable]:
    """A history row's order and whether it is a delete: its ``order_by`` column and
    ``delete_when`` test, or, of a Debezium feed, its event's source position and ``op = 'd'``
    (read from ``_payload``, where the coercion found them valid)."""
    if upsert.debezium:
        event = debezium_envelope_sql()
        return (
            _debezium_order(sql.SQL("({} -> 'source')").format(event)),
            sql.SQL("coalesce({} ->> 'op' = 'd', false)").format(event),
        )
    order = _SOURCE_ORDER if upsert.by_source else sql.SQL("h.{}").format(sql.Identifier(upsert.order_by))
    if upsert.delete_field is None:
        return order, sql.SQL("false")
    # Parameters, not literals: a value may hold '%', which a literal would make a placeholder.
    return order, sql.SQL("coalesce(h._payload -> %(delete_field)s::text = %(delete_equals)s::jsonb, false)")


def _debezium_order(source: sql.Composable) -> sql.Composed:
    """A Debezium event's order from its ``source`` (valid, by the rule of
    :func:`idem_platform.coercion.rules.debezium_position`): ``[lsn]`` of the PostgreSQL
    connector, ``[binlog file number, pos, row]`` of the MySQL one (a ``bigint[]``)."""
    return sql.SQL(
        "CASE WHEN {source} ->> 'lsn' IS NOT NULL THEN ARRAY[({source} ->> 'lsn')::bigint] "
        "ELSE ARRAY[substring({source} ->> 'file' FROM {file_number})::bigint, ({source} ->> 'pos')::bigint, "
        "coalesce(({source} ->> 'row')::bigint, 0)] END"
    ).format(source=source, file_number=sql.Literal(BINLOG_FILE_NUMBER))


# A history row's source order (alias ``h``). A version written before its table was in
# the source's order has none: it comes before every other, ordered by its commit's time
# (``_ingested_at`` is the commit transaction's start) and its offset or line (the number that
# ends ``_source``), so switching an append table to the source's order keeps its history's
# latest versions current.
_SOURCE_ORDER = sql.SQL(
    "coalesce(h._source_order, ARRAY[0, (extract(epoch FROM h._ingested_at) * 1000000)::bigint, "
    "coalesce(substring(h._source FROM '([0-9]{1,18})$')::bigint, 0)])"
)


def _postgres_type(spec: TableSpec, name: str) -> str:
    if name == EXTERNAL_ID:
        return "text"
    if name in (SOURCE_POSITION, SOURCE_ORDER):
        return "bigint[]"
    for column in spec.columns:
        if column.name == name:
            return column.type.postgres
    raise ConfigError(f"{qualified_table_name(spec.record_type)}: no column {name!r}")  # the config checks it first


def _recorded(conn: psycopg.Connection, record_type: str) -> str | None:
    """The state table's recorded definition, or ``None`` when idem keeps no state of ``record_type``."""
    row = conn.execute(
        "SELECT obj_description(to_regclass(%s), 'pg_class')", [state_ident(record_type).as_string(conn)]
    ).fetchone()
    text = row[0] if row else None
    return text if isinstance(text, str) and text.startswith(_MARK) else None


def has_state(conn: psycopg.Connection, record_type: str) -> bool:
    """Whether idem keeps a current state of ``record_type`` (its state table exists)."""
    return _recorded(conn, record_type) is not None


def _drop(conn: psycopg.Connection, record_type: str) -> None:
    """Drop the view and the state table (derived data: the history keeps every version)."""
    try:
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(current_ident(record_type)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(state_ident(record_type)))
    except psycopg.errors.DependentObjectsStillExist as exc:
        raise ConfigError(
            f"idem.{upsert_relations(record_type)[1]} must be rebuilt or dropped "
            f"(its table's mode or upsert keys changed) but other objects depend on it: {exc.diag.message_detail or exc}",
            key=f"tables.{record_type}",
        ) from None


def sync_current(conn: psycopg.Connection, spec: TableSpec) -> None:
    """Inside :func:`~idem_platform.postgres.tables.sync_tables` (DDL lock held, history table
    created): create the state table and view of an upsert table, filled from the history;
    rebuild them when their definition changed; drop them when the table is append again."""
    recorded = _recorded(conn, spec.record_type)
    if spec.upsert is None:
        if recorded is not None:
            _drop(conn, spec.record_type)
        return
    if spec.upsert.by_source:
        _add_source_order(conn, spec.record_type)
    wanted = _definition(spec, spec.upsert)
    if recorded == wanted:
        refresh_current_view(conn, spec.record_type)
        return
    if recorded is not None:
        _drop(conn, spec.record_type)
    for name in upsert_relations(spec.record_type):
        taken = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [_ident(name).as_string(conn)]).fetchone()
        if taken and taken[0]:
            raise ConfigError(
                f"idem.{name} exists and is not idem's current state of {spec.record_type!r} (mode: upsert needs "
                "that name): rename or drop it",
                key=f"tables.{spec.record_type}.mode",
            )
    _create_state(conn, spec, spec.upsert, wanted)
    fold(conn, spec, sql.SQL("TRUE"), {})
    refresh_current_view(conn, spec.record_type)


def _add_source_order(conn: psycopg.Connection, record_type: str) -> None:
    """Give the history of a table in the source's order its ``_source_order`` column (the
    order each commit writes beside its versions); nothing when it has it (no lock taken)."""
    if SOURCE_ORDER in _columns(conn, table_name(record_type)):
        return
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint[]").format(
            _ident(table_name(record_type)), sql.Identifier(SOURCE_ORDER)
        )
    )


def _create_state(conn: psycopg.Connection, spec: TableSpec, upsert: UpsertSpec, comment: str) -> None:
    identity = [
        sql.SQL("{} {} NOT NULL").format(sql.Identifier(n), sql.SQL(_postgres_type(spec, n))) for n in upsert.identity
    ]
    conn.execute(
        sql.SQL(
            "CREATE TABLE {state} ({identity}, _order {order} NOT NULL, _content_hash text NOT NULL, "
            '_record_key text COLLATE "C" NOT NULL, _deleted boolean NOT NULL, _commit_id uuid NOT NULL, '
            "PRIMARY KEY ({key}))"
        ).format(
            state=state_ident(spec.record_type),
            identity=sql.SQL(", ").join(identity),
            order=sql.SQL(_postgres_type(spec, upsert.order_by)),
            key=sql.SQL(", ").join(sql.Identifier(n) for n in upsert.identity),
        )
    )
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(state_ident(spec.record_type), sql.Literal(comment)))


def refresh_current_view(conn: psycopg.Connection, record_type: str) -> None:
    """(Re)create ``idem.<type>_current`` with every column the history has now; nothing
    when ``record_type`` keeps no state. Called wherever the history gains a column: the
    view's ``h.*`` is expanded when the view is made, and history columns are only ever
    appended, so ``CREATE OR REPLACE`` keeps the old columns and adds the new ones."""
    if _recorded(conn, record_type) is None or _columns(conn, upsert_relations(record_type)[1]) == _columns(
        conn, table_name(record_type)
    ):
        return  # up to date: no lock on the view (a reader holding it would make this wait)
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE VIEW {current} AS SELECT h.* FROM {state} s "
            "JOIN {history} h ON h._idempotency_key = s._record_key WHERE NOT s._deleted"
        ).format(current=current_ident(record_type), state=state_ident(record_type), history=_ident(table_name(record_type)))
    )


def _columns(conn: psycopg.Connection, name: str) -> list[str]:
    """The column names of relation ``idem.<name>``, in order (empty when it does not exist)."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
        [_ident(name).as_string(conn)],
    ).fetchall()
    return [str(row[0]) for row in rows]


def fold(
    conn: psycopg.Connection, spec: TableSpec, where: sql.Composable, params: dict[str, object], keep_fresh: bool = False
) -> CurrentCounts:
    """Fold the history rows ``where`` selects (alias ``h``) into the state; what it did.

    Per identity the greatest ``(order, hash, key)`` of those rows is a candidate; it
    replaces the state's row only when greater (the guard), so folding a row twice, or
    rows in any order, gives the same state. Candidates come in identity order, so two
    commits folding the same identities lock their state rows in one order (no deadlock).
    ``stale`` is left to the caller, who knows how many versions it wrote; ``keep_fresh``:
    the result names the inserted versions' record keys (``fresh``)."""
    upsert = spec.upsert
    if upsert is None:
        return CurrentCounts()
    identity = sql.SQL(", ").join(sql.SQL("h.{}").format(sql.Identifier(n)) for n in upsert.identity)
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in upsert.identity)
    order, deleted = _order_and_delete(upsert)
    not_null = sql.SQL(" AND ").join(
        [sql.SQL("h.{} IS NOT NULL").format(sql.Identifier(n)) for n in upsert.identity]
        + [sql.SQL("{} IS NOT NULL").format(order)]
    )
    statement = sql.SQL(
        "INSERT INTO {state} AS s ({columns}, _order, _content_hash, _record_key, _deleted, _commit_id) "
        "SELECT DISTINCT ON ({identity}) {identity}, {order}, h._content_hash, h._idempotency_key, {deleted}, h._commit_id "
        "FROM {history} h WHERE ({where}) AND {not_null} "
        "ORDER BY {identity}, {order} DESC, h._content_hash DESC, h._idempotency_key DESC "
        "ON CONFLICT ({columns}) DO UPDATE SET _order = excluded._order, _content_hash = excluded._content_hash, "
        "_record_key = excluded._record_key, _deleted = excluded._deleted, _commit_id = excluded._commit_id "
        "WHERE (excluded._order, excluded._content_hash, excluded._record_key) > (s._order, s._content_hash, s._record_key) "
        "RETURNING (s.xmax = 0), s._deleted, s._record_key"
    ).format(
        state=state_ident(spec.record_type),
        columns=columns,
        identity=identity,
        order=order,
        deleted=deleted,
        history=_ident(table_name(spec.record_type)),
        where=where,
        not_null=not_null,
    )
    inserted = updated = deleted_count = 0
    kept: set[str] = set()
    params = {**params, "delete_field": upsert.delete_field, "delete_equals": upsert.delete_equals}
    for fresh, is_deleted, record_key in conn.execute(statement, params):
        if is_deleted:
            deleted_count += 1
        elif fresh:
            inserted += 1
            if keep_fresh:
                kept.add(record_key)
        else:
            updated += 1
    return CurrentCounts(inserted=inserted, updated=updated, deleted=deleted_count, fresh=frozenset(kept))


def refold(conn: psycopg.Connection, spec: TableSpec, keys: sql.Composable) -> None:
    """Fold again, from the whole history, the identities of the rows whose record keys
    the query ``keys`` selects (their identity now, and the identity of a state row naming
    one of them), inside the caller's transaction: for ``idem migrate``, which rewrites old
    rows' typed columns in place, so their order, identity or delete mark may have changed
    under a state that was folded from the values before. The guard only lets a greater
    order in, so those identities' state rows are deleted first, then folded anew."""
    upsert = spec.upsert
    if upsert is None:
        return
    names = [sql.Identifier(n) for n in upsert.identity]
    columns = sql.SQL(", ").join(names)
    of_h = sql.SQL(", ").join(sql.SQL("h.{}").format(n) for n in names)
    of_s = sql.SQL(", ").join(sql.SQL("s.{}").format(n) for n in names)
    of_r = sql.SQL(", ").join(sql.SQL("r.{}").format(n) for n in names)
    state, history = state_ident(spec.record_type), _ident(table_name(spec.record_type))
    conn.execute("DROP TABLE IF EXISTS pg_temp.idem_refold")
    conn.execute(
        sql.SQL(
            "CREATE TEMPORARY TABLE idem_refold ON COMMIT DROP AS "
            "SELECT {of_h} FROM {history} h WHERE h._idempotency_key IN ({keys}) "
            "UNION SELECT {of_s} FROM {state} s WHERE s._record_key IN ({keys})"
        ).format(of_h=of_h, of_s=of_s, history=history, state=state, keys=keys)
    )
    conn.execute(
        sql.SQL("DELETE FROM {state} s USING idem_refold r WHERE ({of_s}) = ({of_r})").format(
            state=state, of_s=of_s, of_r=of_r
        )
    )
    fold(conn, spec, sql.SQL("({of_h}) IN (SELECT {columns} FROM idem_refold)").format(of_h=of_h, columns=columns), {})


def fold_commit(
    conn: psycopg.Connection, spec: TableSpec, commit_id: str, written: int, keep_fresh: bool = False
) -> CurrentCounts:
    """Fold the versions commit ``commit_id`` wrote to the history (``written`` of them,
    found by the history's ``_commit_id`` index) into the state, in its transaction.
    ``keep_fresh``: name the inserted versions (the table has effects, which tell inserted
    from updated by them)."""
    counts = fold(conn, spec, sql.SQL("h._commit_id = %(commit_id)s::uuid"), {"commit_id": commit_id}, keep_fresh)
    applied = counts.inserted + counts.updated + counts.deleted
    return CurrentCounts(counts.inserted, counts.updated, counts.deleted, max(written - applied, 0), counts.fresh)
