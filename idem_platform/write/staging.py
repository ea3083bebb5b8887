"""Per-attempt staging tables and the executors' COPY into them.

The driver creates one UNLOGGED *template* per record type plus one for
rejects in schema ``idem_staging`` for each commit. Every task attempt creates
its own tables from them (``<template>_<attempt id>``, on first use) and COPYs
its rows in PostgreSQL's binary format, encoded from the Arrow batches by pgpq
(Rust, never row by row in Python): against CSV it costs the executor a fifth
and PostgreSQL two thirds per row, as no number, timestamp or array is printed
and parsed again.

One table per attempt is what lets the applying transaction take exactly the
attempts whose commit messages reached the driver while reading only their
rows: with one shared table tagged by attempt, each slice's INSERT scanned every
row staged so far (a quarter of the apply's time at 1M records). Rows of
failed, retried or speculative attempts sit in tables nobody reads and are
dropped after the commit (or by the purge schedule, if a zombie attempt creates
one later). Staging columns already have the final PostgreSQL types: JSON is
parsed by the parallel COPYs, not by the single applying INSERT.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterable, Sequence

import numpy as np
import pgpq
import pgpq.encoders
import pgpq.schema
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from idem_platform.coercion import native
from idem_platform.coercion.records import DirectRows
from idem_platform.contract.catalog import Column, TableSpec
from idem_platform.errors import TerminalError, TransientError
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import SCHEMA, STAGING_SCHEMA
from idem_platform.postgres.tables import table_ident
from idem_platform.write.plan import CommitPlan

PROBE_MIN_HITS = 0.25  # a batch with fewer known keys than this share ends an attempt's probing of its type
# Staging tables live for one commit and are read once, in full: autovacuum's
# ANALYZE/VACUUM of them (triggered by a large COPY) is wasted work, and the lock it
# holds made the apply's DROP of the table wait up to deadlock_timeout (1 s) for
# autovacuum to be cancelled, inside the commit.
NO_AUTOVACUUM = "WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off)"
ATTEMPT_ID_HEX = 16  # an attempt's tables are "<template>_<16 hex>": at most 58 characters
STAGED_SYSTEM: tuple[tuple[str, str], ...] = (
    ("_pos", "bigint NOT NULL"),
    ("_idempotency_key", 'text COLLATE "C" NOT NULL'),
    ("_external_id", "text NOT NULL"),
    ("_content_hash", "text NOT NULL"),
    ("_source", "text"),
    ("_payload", "jsonb NOT NULL"),
    ("_extra", "jsonb"),
    ("_props", "jsonb"),
    ("_meta", "jsonb"),  # source metadata (Kafka key, headers...), kept when the plan asks
    ("_version", "integer"),  # a record older than its table: its schema_version (else null: current)
    ("_upgraded", "jsonb"),  # ...and the record upgraded through the migrations (dynamic values come from it)
)
STAGED_REJECT: tuple[tuple[str, str], ...] = (
    ("_pos", "bigint NOT NULL"),
    ("_source", "text NOT NULL"),
    ("_meta", "jsonb"),
    ("_raw", "text NOT NULL"),
    ("_raw_length", "bigint NOT NULL"),
    ("_errors", "jsonb NOT NULL"),
)


def staged_columns(spec: TableSpec) -> list[Column]:
    """The typed columns staged: all but ``dynamic`` ones, which the apply takes
    from ``_payload`` (``_payload -> 'field'``) instead of parsing them twice."""
    return [c for c in spec.columns if c.type.kind != "dynamic"]


def staged_ident(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(STAGING_SCHEMA), sql.Identifier(name))


def new_attempt_id() -> str:
    """A fresh task-attempt id (hex): the suffix of the attempt's staging tables."""
    return secrets.token_hex(ATTEMPT_ID_HEX // 2)


def attempt_table(template: str, attempt: str) -> str:
    """Unquoted name in ``idem_staging`` of an attempt's copy of a staging template."""
    if len(attempt) != ATTEMPT_ID_HEX or not all(c in "0123456789abcdef" for c in attempt):
        raise ValueError(f"attempt id {attempt!r} is not {ATTEMPT_ID_HEX} lowercase hex digits")
    return f"{template}_{attempt}"


def create_staging(conn: psycopg.Connection, plan: CommitPlan) -> None:
    """Create the commit's staging templates (own transaction)."""
    with conn.transaction():
        for record_type, spec in sorted(plan.tables.items()):
            columns = [sql.SQL(f"{{}} {ddl}").format(sql.Identifier(n)) for n, ddl in STAGED_SYSTEM]
            columns += [
                sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type.postgres))
                for c in staged_columns(spec)
            ]
            _create(conn, plan.staging_table(record_type), columns, plan)
        columns = [sql.SQL(f"{{}} {ddl}").format(sql.Identifier(n)) for n, ddl in STAGED_REJECT]
        _create(conn, plan.rejects_table, columns, plan)


def _create(conn: psycopg.Connection, name: str, columns: Sequence[sql.Composable], plan: CommitPlan) -> None:
    conn.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} ({}) {}").format(
            staged_ident(name), sql.SQL(", ").join(columns), sql.SQL(NO_AUTOVACUUM)
        )
    )
    _comment(conn, name, plan)


def _comment(conn: psycopg.Connection, name: str, plan: CommitPlan) -> None:
    """Who owns a staging table and since when (what the purge schedule reads)."""
    comment = {"commit_id": plan.commit_id, "owner": plan.owner, "created_at": time.time()}
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(staged_ident(name), sql.Literal(json.dumps(comment)))
    )


def create_attempt_table(conn: psycopg.Connection, plan: CommitPlan, template: str, attempt: str) -> str:
    """Create an attempt's own copy of a staging template (its own transaction); return its name."""
    name = attempt_table(template, attempt)
    with conn.transaction():  # the table and its owner's note, one commit
        conn.execute(
            sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS) {}").format(
                staged_ident(name), staged_ident(template), sql.SQL(NO_AUTOVACUUM)
            )
        )
        _comment(conn, name, plan)
    return name


def drop_tables(conn: psycopg.Connection, names: Iterable[str]) -> None:
    """``DROP TABLE IF EXISTS`` each staging table, in the caller's transaction (or autocommit)."""
    for name in names:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staged_ident(name)))


def drop_staging(conn: psycopg.Connection, plan: CommitPlan) -> int:
    """Drop every staging table of the commit: templates and all attempts' tables."""
    return drop_commit_staging(conn, plan.commit_id)


def drop_commit_staging(conn: psycopg.Connection, commit_id: str, *, lock_timeout: str = "2s") -> int:
    """Drop every staging table of ``commit_id`` (templates and attempts' tables); return how many.

    Each table is dropped in its own transaction (a savepoint inside the
    caller's), waiting at most ``lock_timeout`` for its lock: a table that a
    zombie attempt still copies into is left for the purge schedule instead of
    holding up the caller.
    """
    prefix = "c" + commit_id.replace("-", "") + "_"
    return _drop_each(conn, _tables_where(conn, "left(c.relname, %s) = %s", [len(prefix), prefix]), lock_timeout)


def drop_stale_staging(conn: psycopg.Connection, older_than_seconds: int, *, lock_timeout: str = "2s") -> int:
    """Drop staging tables created more than ``older_than_seconds`` ago, and any table
    of a commit that already committed (a zombie attempt's late leftovers)."""
    names = _tables_where(
        conn,
        "((obj_description(c.oid, 'pg_class')::jsonb ->> 'created_at')::double precision "
        f"< extract(epoch FROM now()) - %s OR EXISTS (SELECT 1 FROM {SCHEMA}.commits m WHERE "
        "m.commit_id::text = obj_description(c.oid, 'pg_class')::jsonb ->> 'commit_id'))",
        [older_than_seconds],
    )
    return _drop_each(conn, names, lock_timeout)


def _tables_where(conn: psycopg.Connection, condition: str, params: list[object]) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = %s AND c.relkind = 'r' AND {condition} ORDER BY c.relname",
        [STAGING_SCHEMA, *params],
    ).fetchall()
    return [row[0] for row in rows]


def _drop_each(conn: psycopg.Connection, names: list[str], lock_timeout: str) -> int:
    dropped = 0
    for name in names:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(lock_timeout)))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staged_ident(name)))
            dropped += 1
        except psycopg.errors.LockNotAvailable:
            continue
    return dropped


def staged_rows(batch: pa.RecordBatch, record_type: str, spec: TableSpec) -> tuple[pa.RecordBatch, int]:
    """The batch's rows of ``record_type`` in staging column order.

    Returns:
        ``(rows, rows carrying unknown fields in _extra)``.
    """
    typed = batch.column(record_type)
    arrays = [batch.column(name) for name, _ in STAGED_SYSTEM]
    names = [name for name, _ in STAGED_SYSTEM]
    for index, column in enumerate(spec.columns):
        if column.type.kind != "dynamic":
            arrays.append(typed.field(index))
            names.append(column.name)
    # Only the staged columns are filtered: the batch's other record types' structs and its
    # reject columns are not copied once per record type.
    rows = pa.RecordBatch.from_arrays(arrays, names=names).filter(pc.equal(batch.column("_record_type"), record_type))
    return rows, rows.num_rows - rows.column("_extra").null_count


def props_field_names(batch: pa.RecordBatch, record_type: str) -> set[str]:
    """The fields that went to ``props`` in the batch's rows of ``record_type`` (only rows
    that have any are parsed: most batches have none)."""
    props = batch.column("_props")
    if props.null_count == len(props):
        return set()
    mask = pc.and_(pc.equal(batch.column("_record_type"), record_type), pc.is_valid(props))
    return {name for text in props.filter(mask).to_pylist() for name in json.loads(text)}


def staged_rejects(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch's rejects in staging column order."""
    rows = batch.filter(pc.is_valid(batch.column("_errors")))
    names = [name for name, _ in STAGED_REJECT]
    return pa.RecordBatch.from_arrays([rows.column(n) for n in names], names=names)


_JSONB = frozenset(name for name, ddl in STAGED_SYSTEM + STAGED_REJECT if ddl.startswith("jsonb"))


_COPY_ROW = re.compile(r"\bCOPY \S+, line (\d+)(?:, column ([^\s,:]+))?")
REFUSED_RULE = "postgres"  # the rule of a reject PostgreSQL refused at staging


def refused_row(exc: psycopg.errors.DataError, rows: int) -> tuple[int, str | None, str] | None:
    """Which row of a COPY PostgreSQL refused with a data error (0-based), in which column,
    and why; ``None`` when its context names no row of the COPY.

    The COPY context (``COPY <table>, line N, column C``) counts rows from 1 in binary
    COPY as in text. The reason is PostgreSQL's own message (never the refused text:
    the reject that carries it must be storable).
    """
    match = _COPY_ROW.search(exc.diag.context or "")
    if match is None or not 1 <= int(match.group(1)) <= rows:
        return None
    column = match.group(2)
    why = (exc.diag.message_primary or type(exc).__name__).replace("\x00", "\\x00")
    where = f"column '{column}'" if column else "the row"
    return int(match.group(1)) - 1, column, f"PostgreSQL cannot store {where}: {why}"


def refused_as_reject(row: pa.RecordBatch, column: str | None, reason: str) -> pa.RecordBatch:
    """A staged row PostgreSQL refused, as its reject (staging reject columns).

    Its raw text is the record as received (``_payload``, the line's own text, without
    its line end as any reject's raw text), its context the row's source metadata unless
    that is what PostgreSQL refused.
    """
    payload = (row.column("_payload")[0].as_py() or "").removesuffix("\n").removesuffix("\r")
    meta = None if column == "_meta" else row.column("_meta")[0].as_py()
    errors = [{"field": None, "rule": REFUSED_RULE, "message": reason}]
    return pa.RecordBatch.from_arrays(
        [
            row.column("_pos"),
            pa.array([row.column("_source")[0].as_py() or ""], pa.string()),
            pa.array([meta], pa.string()),
            pa.array([payload.replace("\x00", "\\x00")], pa.string()),
            pa.array([len(payload.encode("utf-8", "surrogatepass"))], pa.int64()),
            pa.array([json.dumps(errors, ensure_ascii=False)], pa.string()),
        ],
        names=[name for name, _ in STAGED_REJECT],
    )


def storable_reject(row: pa.RecordBatch, column: str | None, reason: str) -> pa.RecordBatch:
    """A staged reject PostgreSQL refused, made storable: without its context (the source
    metadata, the one part not built by idem) and with the refusal among its reasons."""
    errors = json.loads(row.column("_errors")[0].as_py())
    errors.append({"field": None, "rule": REFUSED_RULE, "message": reason})
    raw = (row.column("_raw")[0].as_py() or "").replace("\x00", "\\x00")
    if column not in (None, "_meta", "_raw", "_errors"):
        raise TerminalError(f"PostgreSQL refused column {column!r} of a reject at {row.column('_source')[0]}: {reason}")
    return pa.RecordBatch.from_arrays(
        [
            row.column("_pos"),
            row.column("_source"),
            pa.nulls(1, pa.string()),
            pa.array([raw], pa.string()),
            row.column("_raw_length"),
            pa.array([json.dumps(errors, ensure_ascii=False)], pa.string()),
        ],
        names=[name for name, _ in STAGED_REJECT],
    )


class BinaryCopy:
    """``COPY <staging table> FROM STDIN (FORMAT binary)`` of Arrow batches of one schema.

    Timestamps must be microseconds (the ``coerced`` frame's Spark shapes are);
    text columns named like the staged JSON columns are sent as ``jsonb``.
    """

    def __init__(self, table: str, schema: pa.Schema) -> None:
        encoders = {
            field.name: pgpq.encoders.StringEncoderBuilder.new_with_output(field, pgpq.schema.Jsonb())
            if field.name in _JSONB
            else pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(field)
            for field in schema
        }
        self.schema = schema
        self.encoders = encoders
        self.statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
            staged_ident(table), sql.SQL(", ").join(sql.Identifier(name) for name in schema.names)
        )

    def write(self, conn: psycopg.Connection, rows: pa.RecordBatch) -> int:
        """COPY ``rows`` in (one statement); returns the rows PostgreSQL took."""
        # An encoder is one COPY stream (it buffers until finish()); making one costs ~70 µs.
        encoder = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(self.schema, self.encoders)
        with conn.cursor() as cursor:
            with cursor.copy(self.statement) as copy:
                copy.write(encoder.write_header())
                copy.write(encoder.write_batch(rows))
                copy.write(encoder.finish())
            return cursor.rowcount


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
_COPY_TRAILER = b"\xff\xff"


def copy_direct(conn: psycopg.Connection, table: str, columns: list[str], rows: bytes | bytearray | memoryview) -> int:
    """COPY rows already in PostgreSQL's binary tuple format (:class:`DirectRows`) in one statement;
    returns the rows PostgreSQL took."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
        staged_ident(table), sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    )
    with conn.cursor() as cursor:
        with cursor.copy(statement) as copy:
            copy.write(_COPY_HEADER)
            copy.write(rows)
            copy.write(_COPY_TRAILER)
        return cursor.rowcount


def in_key_order(data: bytes | bytearray, ends: Sequence[int], keys: Sequence[str], held: set[int]) -> tuple[bytes, int]:
    """The COPY tuples in ``data`` (each ending at its ``ends``) but the ``held`` ones
    (1-based positions), sorted by their idempotency ``keys``; and how many.

    Why sorted: the applying ``INSERT … SELECT`` reads a staged table in the order it
    was written, and the table's primary key is the idempotency key, a hash. In key
    order, consecutive insertions (and the anti-join's probes) land on neighbouring
    index pages, and into an empty table on PostgreSQL's right-edge fast path, instead
    of a random page each: about a quarter less of the apply's single-backend CPU per
    row at the shared benchmark's row width, paid for by a sort in the parallel
    executors. Nothing reads meaning into the staged order (the apply's ``DISTINCT
    ON`` names its own order).
    """
    order = sorted((i for i in range(len(ends)) if i + 1 not in held) if held else range(len(ends)), key=keys.__getitem__)
    return native.gather(data, list(ends), order), len(order)


def staged_column_names(spec: TableSpec) -> list[str]:
    """The staging table's columns in staging order (what :func:`staged_rows` and direct rows hold)."""
    return [name for name, _ in STAGED_SYSTEM] + [c.name for c in staged_columns(spec)]


class StagingWriter:
    """One task attempt's COPY stream into the commit's staging tables.

    Args:
        url: PostgreSQL URL reachable from this executor.
        plan: the commit plan.
        attempt: a unique id of this task attempt.
    """

    def __init__(self, url: str, plan: CommitPlan, attempt: str) -> None:
        attempt_table("t", attempt)  # validates the id before anything is created
        self.plan = plan
        self.attempt = attempt
        self.conn = connect(url, autocommit=True, application_name=f"idem-stage-{attempt[:8]}")
        # Nothing staged needs to survive a crash: the tables are UNLOGGED (emptied by
        # crash recovery) and count only once the driver's applying transaction, a
        # synchronous commit whose WAL flush covers everything written before it,
        # commits. So this attempt's own commits (its tables' DDL, each COPY) do not
        # wait for a WAL flush: ~0.2 s of a task that stages many record types.
        self.conn.execute("SET synchronous_commit = off")
        self.rows: dict[str, int] = {}
        self.known: dict[str, int] = {}  # rows not staged: the table held their keys
        self._probing = set(plan.probe_known)
        self.with_extra: dict[str, int] = {}
        self.props_fields: dict[str, set[str]] = {}  # record type -> fields that went to props
        self.rejected = 0
        self._copiers: dict[str, BinaryCopy] = {}
        self._tables: dict[str, str] = {}  # template -> this attempt's table

    def _table(self, template: str) -> str:
        """This attempt's table of ``template``, created on first use."""
        table = self._tables.get(template)
        if table is None:
            table = self._tables[template] = create_attempt_table(self.conn, self.plan, template, self.attempt)
        return table

    def _copy(self, template: str, rows: pa.RecordBatch) -> None:
        copier = self._copiers.get(template)
        if copier is None:
            copier = self._copiers[template] = BinaryCopy(self._table(template), rows.schema)
        self._check(template, copier.write(self.conn, rows), rows.num_rows)

    @staticmethod
    def _check(template: str, copied: int, rows: int) -> None:
        if copied != rows:  # the commit message would vouch for rows that are not there
            raise TransientError(f"COPY staged {copied} of {rows} rows into {template}; nothing was committed")

    def write(self, batch: pa.RecordBatch, direct: DirectRows | None = None) -> None:
        """Stage one batch of the ``coerced`` frame, and the rows ``coerce_batch`` wrote to ``direct``.

        A row PostgreSQL refuses (a data error: text or JSON it cannot store) becomes that
        record's reject: one record's bytes never fail the batch, nor block a Kafka
        partition behind it on every retry.
        """
        refusals: list[pa.RecordBatch] = []
        for record_type, spec in self.plan.tables.items():
            rows, with_extra = staged_rows(batch, record_type, spec)
            if rows.num_rows and record_type in self._probing:
                rows = self._without_known(record_type, rows)
            if rows.num_rows:
                # In key order, as direct rows are (see in_key_order).
                rows = rows.take(pc.sort_indices(rows, [("_idempotency_key", "ascending")]))
                staged, refused = self._copy_each(self.plan.staging_table(record_type), rows)
                self.rows[record_type] = self.rows.get(record_type, 0) + staged
                with_extra -= sum(row.column("_extra").null_count == 0 for row, _, _ in refused)
                self.with_extra[record_type] = self.with_extra.get(record_type, 0) + with_extra
                refusals.extend(refused_as_reject(*refusal) for refusal in refused)
                props = props_field_names(batch, record_type)
                if props:
                    self.props_fields.setdefault(record_type, set()).update(props)
            if direct is not None and direct.count(record_type):
                self._write_direct(record_type, spec, direct)
        rejects = staged_rejects(batch)
        if refusals:
            rejects = pa.Table.from_batches([rejects, *refusals]).combine_chunks().to_batches()[0]
        if rejects.num_rows:
            staged, unstorable = self._copy_each(self.plan.rejects_table, rejects)
            self.rejected += staged
            if unstorable:
                fixed = pa.Table.from_batches([storable_reject(*refusal) for refusal in unstorable])
                fixed_rows = fixed.combine_chunks().to_batches()[0]
                self._copy(self.plan.rejects_table, fixed_rows)  # a reject refused again fails the batch
                self.rejected += fixed_rows.num_rows

    def _copy_each(self, template: str, rows: pa.RecordBatch) -> tuple[int, list[tuple[pa.RecordBatch, str | None, str]]]:
        """COPY ``rows`` but those PostgreSQL refuses with a data error. Returns how many
        were staged, and each refused row with the column refused and why.

        A failed COPY stages nothing (autocommit: its own statement), and PostgreSQL stops
        at the first refused row, so the rows before it are COPYed again and the rest
        tried on. A data error that names no row is the batch's, terminal: a retry would
        meet the same data.
        """
        staged = 0
        refused: list[tuple[pa.RecordBatch, str | None, str]] = []
        while rows.num_rows:
            try:
                self._copy(template, rows)
                return staged + rows.num_rows, refused
            except psycopg.errors.DataError as exc:
                found = refused_row(exc, rows.num_rows)
                if found is None:
                    raise TerminalError(f"PostgreSQL refused data staged into {template}: {exc}") from exc
            index, column, reason = found
            if index:
                self._copy(template, rows.slice(0, index))
                staged += index
            refused.append((rows.slice(index, 1), column, reason))
            rows = rows.slice(index + 1)
        return staged, refused

    def _write_direct(self, record_type: str, spec: TableSpec, direct: DirectRows) -> None:
        """COPY a record type's direct rows in key order (without those the table already
        holds, while probing)."""
        keys = direct.keys[record_type]
        held: set[int] = set()
        if record_type in self._probing:
            held = set(self._known_indexes(record_type, keys))
            self.known[record_type] = self.known.get(record_type, 0) + len(held)
        data, count = in_key_order(direct.rows[record_type], direct.ends[record_type], keys, held)
        if count:
            template = self.plan.staging_table(record_type)
            try:
                copied = copy_direct(self.conn, self._table(template), staged_column_names(spec), data)
            except psycopg.errors.DataError as exc:
                # The C parser only writes records it is sure of; should PostgreSQL still
                # refuse one, retrying meets the same bytes: terminal, not transient.
                raise TerminalError(f"PostgreSQL refused a record staged into {template}: {exc}") from exc
            self._check(template, copied, count)
            self.rows[record_type] = self.rows.get(record_type, 0) + count

    def _known_indexes(self, record_type: str, keys: list[str]) -> list[int]:
        """The (1-based) positions of the ``keys`` the table holds; stops the attempt's probing
        of the type when they are under :data:`PROBE_MIN_HITS` of them."""
        if not keys or any("\n" in key for key in keys):
            return []
        # One text parameter, split by the server: a key never holds a newline (an
        # external id that is not printable ASCII is hashed into the key), and
        # psycopg's text[] dumper would cost more Python per key than the probe.
        query = sql.SQL(
            "SELECT k.i FROM unnest(string_to_array(%s, E'\\n')) WITH ORDINALITY AS k(key, i) "
            "WHERE EXISTS (SELECT 1 FROM {} t WHERE t._idempotency_key = k.key)"
        ).format(table_ident(record_type))
        with self.conn.cursor(binary=True) as cursor:
            found = [i for (i,) in cursor.execute(query, ["\n".join(keys)]).fetchall()]
        if len(found) < PROBE_MIN_HITS * len(keys):
            self._probing.discard(record_type)
        return found

    def _without_known(self, record_type: str, rows: pa.RecordBatch) -> pa.RecordBatch:
        """``rows`` without those whose key the table holds (counted in :attr:`known`).

        Rows that already sit in the table are skips whatever happens next (the
        product never deletes a row), so staging them only costs: their binary
        COPY, PostgreSQL's parse of their JSON and the apply's reading them back.
        Re-delivered data (the same rows in new files, a topic replayed from an
        earlier offset) is mostly such rows. One index probe per key instead, and
        only while it pays: when under :data:`PROBE_MIN_HITS` of a batch's keys
        are known, this attempt stops probing the type and stages everything
        (the apply's anti-join skips the rest, as for any table). Rows with
        unknown fields are always staged: the apply's schema evolution looks
        at every staged row's fields, as it would without the probe.
        """
        keys = rows.column("_idempotency_key")
        plain = pc.is_null(rows.column("_extra"))
        candidates = pc.filter(keys, plain)
        found = self._known_indexes(record_type, candidates.to_pylist())
        if not found:
            return rows
        held = np.zeros(len(candidates), dtype=bool)
        held[np.asarray(found, dtype=np.int64) - 1] = True  # ORDINALITY counts from 1
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[np.flatnonzero(plain.to_numpy(zero_copy_only=False))[held]] = False
        self.known[record_type] = self.known.get(record_type, 0) + len(found)
        return rows.filter(pa.array(keep))

    def close(self) -> None:
        self.conn.close()


def drop_staging_quietly(url: str, commit_ids: Iterable[str]) -> None:
    """Best-effort drop of the staging tables of ``commit_ids`` (own connection).

    Never raises and never waits long: what stays (a table a zombie attempt
    still holds, PostgreSQL unreachable) is dropped by the purge schedule.
    """
    try:
        with connect(url, autocommit=True, application_name="idem-cleanup") as conn:
            for commit_id in commit_ids:
                drop_commit_staging(conn, commit_id)
    except psycopg.Error:
        pass
