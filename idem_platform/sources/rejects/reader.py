"""Read planned rejects back from ``idem.rejects`` as raw records; runs on executors.

A slice is a set of runs of consecutive reject ids (``[lo, hi]``, each within one
unit), so the plan stays small however many rejects it covers. The task reads the
runs' rows in one query and hands them to the coercion as
:data:`~idem_platform.write.batch.RECORDS_SCHEMA` batches: the raw text as
UTF-8 bytes, the original line or offset (``_offset``, so the position, and with
it a positional key, is the original one) and the source's context (a Kafka
message's key and headers) as ``_meta``. A tombstone (a Kafka message without a
value, rule ``no_value``) is read back as a missing value, so it fails as it did.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa

from idem_platform.errors import TransientError
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import SCHEMA
from idem_platform.write.batch import RECORDS_SCHEMA

FETCH_ROWS = 5000

READ_SQL = f"""
SELECT g.unit, r.line,
       CASE WHEN r.raw = '' AND r.reasons @> '[{{"rule": "no_value"}}]' THEN NULL
            ELSE convert_to(r.raw, 'UTF8') END,
       r.context::text
FROM unnest(%s::bigint[], %s::bigint[], %s::int[]) AS g(lo, hi, unit)
JOIN {SCHEMA}.rejects r ON r.reject_id BETWEEN g.lo AND g.hi
ORDER BY r.reject_id
"""


@dataclass(frozen=True)
class RejectsSlice:
    """Runs of reject ids one Spark task reads: ``(unit id, lo, hi)``, ids inclusive.

    ``url`` is the PostgreSQL the executors read from (the one the commit stages
    into, which they reach already).
    """

    url: str
    runs: tuple[tuple[str, int, int], ...]

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(unit for unit, _, _ in self.runs))

    @property
    def records(self) -> int:
        return sum(hi - lo + 1 for _, lo, hi in self.runs)

    def read(
        self, index_of: Mapping[str, int], *, max_record_bytes: int, limit: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        return read_rejects(self, index_of, limit=limit)


def _batch(units: list[int], lines: list[int], raws: list[bytes | None], metas: list[str | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(units, pa.int32()),
            pa.array(lines, pa.int64()),
            pa.array(raws, pa.binary()),
            pa.array([0 if raw is None else len(raw) for raw in raws], pa.int64()),
            pa.array(metas, pa.string()),
            pa.nulls(len(units), pa.int64()),
        ],
        schema=RECORDS_SCHEMA,
    )


def read_rejects(piece: RejectsSlice, index_of: Mapping[str, int], *, limit: int | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the slice's rejects as record batches, in reject id order.

    Raises:
        TransientError: rows of the plan are gone (deleted since it was planned): the
            commit would mark rejects it never tried, so nothing may commit.
    """

    order = piece.unit_ids
    position = {unit: i for i, unit in enumerate(order)}
    batch_index = [index_of[unit] for unit in order]
    los = [lo for _, lo, _ in piece.runs]
    his = [hi for _, _, hi in piece.runs]
    owners = [position[unit] for unit, _, _ in piece.runs]
    expected = piece.records if limit is None else None
    seen = 0
    with connect(piece.url, application_name="idem-rejects-read") as conn, conn.transaction():
        with conn.cursor(name="idem_rejects_read") as cursor:
            cursor.itersize = FETCH_ROWS
            cursor.execute(READ_SQL, [los, his, owners])
            while True:
                rows = cursor.fetchmany(FETCH_ROWS)
                if not rows:
                    break
                seen += len(rows)
                yield _batch(
                    [batch_index[row[0]] for row in rows],
                    [row[1] for row in rows],
                    [row[2] for row in rows],
                    [row[3] for row in rows],
                )
                if limit is not None and seen >= limit:
                    return
    if expected is not None and seen != expected:
        raise TransientError(
            f"{expected - seen} of the {expected} rejects planned for this slice are no longer in "
            f"{SCHEMA}.rejects (deleted since the retry was planned); nothing was committed"
        )
