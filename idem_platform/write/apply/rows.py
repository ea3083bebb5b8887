"""The row inserts per table: the ``INSERT … SELECT`` that moves one attempt's staged
rows of a record type into its table, and what a transaction's inserts did so far."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import SOURCE_ORDER, STRING, Column, TableSpec
from idem_platform.postgres.retype import retype_cast
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import effective_spec, existing_columns, table_ident
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.apply.evolution import MAX_NEW_COLUMNS, Evolution, props_reasons
from idem_platform.write.apply.locks import add_column_politely, lock_wait
from idem_platform.write.plan import CommitPlan


class TableInserts:
    """The inserts of one applying transaction, and what they did per record type.

    Kept apart from the transaction's own state so that a conflict, which rolls the
    transaction back, forgets all of it at once: the transaction starts a new one.
    """

    def __init__(self, conn: psycopg.Connection, plan: CommitPlan) -> None:
        self.conn = conn
        self.plan = plan
        self.written = dict.fromkeys(self.plan.tables, 0)
        # Per record type, rows written per unit position prefix: only for a plan of
        # several units (a one-unit commit's unit wrote all of ``written``).
        self.written_by_prefix: dict[str, dict[str, int]] | None = (
            {rt: {} for rt in self.plan.tables} if plan.count_per_unit and len(self.plan.units) > 1 else None
        )
        self.added: dict[str, list[str]] = {rt: [] for rt in self.plan.tables}
        self.to_props: dict[str, list[str]] = {rt: [] for rt in self.plan.tables}
        self.props_reasons: dict[str, dict[str, str]] = {rt: {} for rt in self.plan.tables}
        self.budget = MAX_NEW_COLUMNS
        self.inserted: set[tuple[str, int]] = set()  # (record type, partition) already inserted
        self.deferred: set[str] = set()  # record types left to finish (a new column is needed)
        self.filled: set[str] = set()  # record types whose evolved columns got values
        # Per record type, its retyped text columns (``idem retype``), read once its table is
        # locked in this transaction (an ``idem retype`` cannot add a companion column after that).
        self.retyped: dict[str, dict[str, Column]] = {}
        self.commit_order: int | None = None  # this transaction's number in idem.source_order, once drawn

    def _commit_order(self, spec: TableSpec) -> int | None:
        """For a table in the source's order (an upsert table without ``order_by``): this
        commit's number, drawn from ``idem.source_order`` at its first insert into one, so
        after its plan: a Kafka range is planned from the committed offsets, so a later range
        of a partition draws a greater number than the commit of the range before it (a
        commit that must wait for its offsets' compare-and-set cannot have drawn first)."""
        if spec.upsert is None or not spec.upsert.by_source:
            return None
        if self.commit_order is None:
            row = self.conn.execute("SELECT nextval('idem.source_order')").fetchone()
            assert row is not None
            self.commit_order = int(row[0])
        return self.commit_order

    def _retyped_columns(self, record_type: str) -> dict[str, Column]:
        """The table's retyped text columns (``idem retype``), read under its lock.

        The first insert of a transaction into a table takes the ``ROW EXCLUSIVE``
        lock its INSERT would take anyway, then reads the columns: a retype's
        ``ALTER TABLE`` committed before is seen, and none can commit after it until
        this transaction ends. So no row of this commit misses its typed value, and
        the retype's backfill sees every row committed before its column was.
        """
        found = self.retyped.get(record_type)
        if found is None:
            self.conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(table_ident(record_type)))
            spec = effective_spec(self.plan.tables[record_type], existing_columns(self.conn, record_type))
            found = self.retyped[record_type] = {c.name: c for c in spec.retyped_columns()}
        return found

    def insert(
        self, record_type: str, stage: sql.Composed, message: StagedAttempt, evolution: Evolution, *, streaming: bool
    ) -> None:
        """Insert one attempt's staged rows of ``record_type`` and count what that did
        (``streaming``: a conflict must end streaming, not the commit)."""
        by_prefix = self.written_by_prefix[record_type] if self.written_by_prefix is not None else None
        prefix = self._one_prefix(message) if by_prefix is not None else None
        with lock_wait(self.plan, f"table {qualified_table_name(record_type)}", streaming=streaming):
            retyped = self._retyped_columns(record_type)
            count = insert_rows(
                self.conn,
                self.plan,
                record_type,
                self.plan.tables[record_type],
                stage,
                evolution,
                unique_keys=message.unique_keys,
                on_conflict=not streaming,
                retyped=retyped,
                by_prefix=by_prefix if prefix is None else None,
                commit_order=self._commit_order(self.plan.tables[record_type]),
            )
        self.written[record_type] += count
        if by_prefix is not None and prefix is not None:
            by_prefix[prefix] = by_prefix.get(prefix, 0) + count
        self.inserted.add((record_type, message.partition))
        if evolution.fill:
            self.filled.add(record_type)
        for key in evolution.to_props:
            if key not in self.to_props[record_type]:
                self.to_props[record_type].append(key)
        self.props_reasons[record_type].update(evolution.reasons)

    def _one_prefix(self, message: StagedAttempt) -> str | None:
        """The one unit position prefix of every row ``message`` staged, if its records all
        came from units of one prefix (a slice of one file, typically); else ``None``.

        Then the insert's row count is that unit's, and the per-unit count needs no
        ``RETURNING _source`` grouped by prefix: measured, that costs the single applying
        backend about a fifth more CPU per row.
        """
        if message.records is None:
            return None
        prefixes = {self.plan.units[index].position_prefix for index in message.records}
        return prefixes.pop() if len(prefixes) == 1 else None

    def evolve(self, record_type: str, keys: list[str]) -> Evolution:
        """What each unknown field becomes: a text column (added now, within the budget) or ``props``."""
        result = Evolution()
        columns = existing_columns(self.conn, record_type)
        for key in keys:
            type_ = columns.get(key)
            if type_ == STRING.postgres:
                result.fill.append(key)
            elif type_ is None and self.budget > 0:
                add_column_politely(self.conn, self.plan, record_type, Column(key, STRING, evolved=True))
                self.budget -= 1
                self.added[record_type].append(key)
                result.fill.append(key)
            else:
                result.to_props.append(key)
                result.reasons[key] = (
                    f"{qualified_table_name(record_type)} has a {type_} column of that name, not text"
                    if type_ is not None
                    else f"over the {MAX_NEW_COLUMNS} new columns one batch may add"
                )
        return result

    def tables(self, chosen: list[StagedAttempt], staged: dict[str, int]) -> dict[str, dict[str, Any]]:
        """The result's ``tables``: per record type with staged rows, what its inserts did."""
        return {
            rt: {
                "written": self.written[rt],
                "skipped": staged[rt] - self.written[rt],
                "new_columns": self.added[rt],
                "to_props": self.to_props[rt],
                "props_fields": props_reasons(rt, chosen, self.props_reasons[rt]),
            }
            for rt in sorted(self.plan.tables)
            if staged[rt]
        }


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
    retyped: dict[str, Column] | None = None,
    by_prefix: dict[str, int] | None = None,
    commit_order: int | None = None,
) -> int:
    """Insert one staged table's rows of ``record_type`` whose keys the table lacks; return how many.

    ``unique_keys``: the attempt staged no key twice (no ``DISTINCT ON`` sort);
    ``on_conflict``: streaming met another writer's keys, so wait for it and skip them;
    ``retyped``: the table's retyped text columns (``idem retype``), to fill their
    typed companions; ``by_prefix``: when given, gains the rows inserted per position
    prefix (per unit); ``commit_order``: the commit's number of a table in the source's
    order: each row's ``_source_order`` is ``[commit_order, its _pos]`` (its unit's index in
    the plan, then its offset or line: the source's order within the commit).
    """
    target, select = _columns(plan, spec, evolution, retyped or {})
    if commit_order is not None:
        target.append(SOURCE_ORDER)
        select.append(sql.SQL("ARRAY[%(commit_order)s::bigint, s._pos]"))
    # First occurrence per key wins. An attempt whose executor vouched for distinct
    # keys needs no sort of its wide rows; the anti-join alone skips keys already
    # in the table (committed, or applied from an earlier slice of this commit).
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
        "commit_order": commit_order,
    }
    if by_prefix is None:
        return conn.execute(statement, params).rowcount
    # Count what was inserted per unit, by the position prefix of each row's ``_source``
    # (a prefix ends in a non-digit, its offset is all digits): the counts the batch's
    # total is the sum of, from the same statement.
    counted = sql.SQL(
        "WITH ins AS ({insert} RETURNING _source) SELECT rtrim(_source, '0123456789'), count(*) FROM ins GROUP BY 1"
    ).format(insert=statement)
    total = 0
    for prefix, count in conn.execute(counted, params).fetchall():
        by_prefix[str(prefix)] = by_prefix.get(str(prefix), 0) + int(count)
        total += int(count)
    return total


def _columns(
    plan: CommitPlan, spec: TableSpec, evolution: Evolution, retyped: dict[str, Column]
) -> tuple[list[str], list[sql.Composable]]:
    """The target table's columns the insert writes, and the select list that fills them
    from a staged row ``s``, in the same order."""
    typed = [c.name for c in spec.columns]
    # Retyped text columns (idem retype): their typed companions, filled from the
    # same text by the safe cast the backfill uses (NULL when it does not cast).
    companions = [c for c in typed + evolution.fill if c in retyped]
    target = [
        "_idempotency_key", "_connector", "_record_type", "_external_id", "_content_hash",
        "_schema_version", "_commit_id", "_ingested_at", "_source", "_payload",
    ] + typed + evolution.fill + ["props"] + ([plan.meta_column] if plan.meta_column else [])
    target += [str(retyped[c].typed_column) for c in companions]
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
    select.append(_props(evolution))
    if plan.meta_column:
        select.append(sql.SQL("s._meta"))
    fills = set(evolution.fill) - set(typed)
    select += [
        sql.SQL("{}({})").format(
            retype_cast(retyped[c]),
            sql.SQL("s._extra ->> {}").format(sql.Literal(c)) if c in fills else sql.SQL("s.{}").format(sql.Identifier(c)),
        )
        for c in companions
    ]
    return target, select


def _props(evolution: Evolution) -> sql.SQL:
    """The row's ``props``: as staged, plus the unknown fields evolution sent there
    (``%(overcap)s``: over the new-column budget, or a non-text column's name)."""
    props = sql.SQL("s._props")
    if evolution.to_props:
        props = sql.SQL(
            "CASE WHEN s._extra ?| %(overcap)s THEN coalesce(s._props, '{}'::jsonb) || "
            "(SELECT jsonb_object_agg(k, coalesce(s._upgraded, s._payload) -> k) FROM jsonb_object_keys(s._extra) k "
            "WHERE k = ANY(%(overcap)s)) ELSE s._props END"
        )
    return props
