"""Executors: one partition of a table read, from PostgreSQL's CSV ``COPY`` to Arrow batches.

No JDBC driver is needed, and no value is converted by Python: PostgreSQL prints
each row once (``COPY … TO STDOUT (FORMAT csv)``), the rows are joined into
blocks of whole rows (PostgreSQL sends one message per row, so a block never cuts
one), and Arrow's CSV reader (C++) parses each block into typed columns. Only
vectors need a step more: ``{1,2.5}`` is split and cast by Arrow kernels too.

Why CSV and not the binary format: Arrow reads CSV natively, while PostgreSQL's
binary format would need a decoder per type (in Python: a call per value).
``NULL`` is the unquoted empty field and an empty string is ``""`` (PostgreSQL
quotes it), which Arrow tells apart with ``quoted_strings_can_be_null=False``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from psycopg import pq
from psycopg.errors import error_from_result

from idem_platform.postgres.connection import connect
from idem_platform.read.plan import ReadPlan

BLOCK_BYTES = 4 << 20  # CSV bytes per Arrow batch (~10,000 threat-feed rows)
# The session settings the CSV texts are parsed under: UTC offsets "+00", ISO dates.
SESSION = ("SET TimeZone = 'UTC'", "SET DateStyle = 'ISO, YMD'", "SET extra_float_digits = 1")
_TIMESTAMP_PARSERS = ["%Y-%m-%d %H:%M:%S%z", pcsv.ISO8601]


def _csv_type(kind: str, arrow: pa.DataType) -> pa.DataType:
    return pa.string() if kind == "vector" else arrow


def _options(plan: ReadPlan) -> tuple[pcsv.ReadOptions, pcsv.ParseOptions, pcsv.ConvertOptions]:
    names = [c.name for c in plan.columns]
    return (
        pcsv.ReadOptions(column_names=names, use_threads=False, block_size=BLOCK_BYTES * 2),
        pcsv.ParseOptions(newlines_in_values=True),
        pcsv.ConvertOptions(
            column_types={c.name: _csv_type(c.kind, c.arrow) for c in plan.columns},
            null_values=[""],
            true_values=["t"],
            false_values=["f"],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            timestamp_parsers=_TIMESTAMP_PARSERS,
        ),
    )


def _vector(text: pa.Array) -> pa.Array:
    """PostgreSQL's ``real[]`` text (``{1,2.5,-3e+38}``) as ``list<float32>``."""
    inner = pc.utf8_slice_codeunits(text, 1, -1)
    return pc.split_pattern(inner, ",").cast(pa.list_(pa.float32()))


def _typed(table: pa.Table, plan: ReadPlan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The parsed block in the frame's schema (vectors split, types as Spark wants them)."""
    arrays = []
    for column, target in zip(plan.columns, schema, strict=True):
        array = table.column(column.name).combine_chunks() if table.num_rows else pa.array([], _csv_type(column.kind, column.arrow))
        if column.kind == "vector":
            array = _vector(array)
        arrays.append(array.cast(target.type))
    yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_rows(plan: ReadPlan, index: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Partition ``index`` of the plan, as stored (old rows not upgraded yet), in batches of
    about :data:`BLOCK_BYTES` of CSV."""
    read_options, parse_options, convert_options = _options(plan)

    def parse(chunks: list[bytes]) -> Iterator[pa.RecordBatch]:
        table = pcsv.read_csv(
            pa.BufferReader(b"".join(chunks)),
            read_options=read_options,
            parse_options=parse_options,
            convert_options=convert_options,
        )
        yield from _typed(table, plan, schema)

    with connect(plan.url, autocommit=True, application_name="idem-read") as conn:
        for statement in SESSION:
            conn.execute(statement)
        chunks: list[bytes] = []
        size = 0
        for chunk in copy_out(conn, plan.query(index).as_bytes(conn)):
            chunks.append(chunk)
            size += len(chunk)
            if size >= BLOCK_BYTES:
                yield from parse(chunks)
                chunks, size = [], 0
        if chunks:
            yield from parse(chunks)


def copy_out(conn: psycopg.Connection, statement: bytes) -> Iterator[bytes]:
    """The rows of ``COPY … TO STDOUT``, one message each, straight from libpq.

    psycopg's ``Copy`` object waits on a generator per row, which costs about 1 µs a
    row more here (a million-row read: a core-second); the statement is a plain query
    on an idle autocommit connection, so libpq's own blocking calls are enough.

    Raises:
        psycopg.Error: PostgreSQL refused the statement or failed during the copy.
    """
    pgconn = conn.pgconn
    pgconn.send_query(statement)
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        error = error_from_result(result) if result is not None else psycopg.OperationalError("no result")
        _drain(pgconn)
        raise error
    get = pgconn.get_copy_data
    while True:
        size, data = get(0)  # blocks until a row (or the end) arrives
        if size < 0:
            break
        yield data  # type: ignore[misc]
    result = pgconn.get_result()
    _drain(pgconn)
    if size == -2 or result is None or result.status != pq.ExecStatus.COMMAND_OK:
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            raise error_from_result(result)
        raise psycopg.OperationalError(pgconn.get_error_message() or "COPY TO STDOUT failed")


def _drain(pgconn: pq.abc.PGconn) -> None:
    while pgconn.get_result() is not None:
        pass
