"""The one batch type every connector plans into and the commit path consumes.

A connector turns what waits at its source into *units* and *slices*:

* a **unit** is what the ledger vouches for: a dropped file, one Kafka
  partition's offset range. It has a ledger key and request, a position text
  for each of its records (``<sha256[:16]>#L<line>``, ``<topic>-<partition>@<offset>``)
  and the entry it leaves in ``idem.commits.sources``;
* a **slice** is what one Spark task reads: a byte range of a file, a run of
  offsets. ``read()`` runs on an executor and yields Arrow batches of raw
  records (:data:`RECORDS_SCHEMA`), never a Python row at a time;
* an optional **commit step** runs inside the applying transaction (the Kafka
  offsets' compare-and-set) and, best effort, after it commits.

The commit path (``write/``, ``spark/stage.py``, coercion) sees only these:
it never knows what a file or a topic is, so every source shares one write path.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

if TYPE_CHECKING:
    import psycopg

# What a slice reader yields: one row per raw record of the source.
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("_unit", pa.int32()),  # index of the record's unit in the batch
        pa.field("_offset", pa.int64()),  # its line number (files, from 1) or offset (Kafka)
        pa.field("_raw", pa.binary()),  # the raw bytes (cut at the record limit); null: no value
        pa.field("_raw_length", pa.int64()),  # the record's real length in bytes
        pa.field("_meta", pa.string()),  # source metadata as JSON (Kafka key, headers...), or null
        pa.field("_timestamp", pa.int64()),  # the source's timestamp, epoch milliseconds, or null
    ]
)


@dataclass(frozen=True)
class Unit:
    """One ledger-keyed piece of a source.

    Attributes:
        id: unique within its batch (a file's path, ``<topic>-<partition>``); slices name it.
        key: the ledger key (``filedrop:<sha256>``, ``kafka:<topic>-<partition>@<start>``).
            Two units may share one (two paths with the same bytes).
        request: what the ledger hashes for ``key``.
        position_prefix: a record's position is this prefix and its offset.
        base: subtracted from offsets in the staged ``_pos`` (0 for files; a range's start).
        label: how people name the unit (a path, ``events-0``).
        location: format of one record's place for people: ``{label}`` and ``{offset}``.
        span: which part of the source the unit covers, for people (a range's offsets).
        records: records planned (lines of a file; offsets of a range).
        size: bytes planned (0 when unknown before reading).
        source: the unit's entry in ``idem.commits.sources`` and in summaries.
    """

    id: str
    key: str
    request: dict[str, Any]
    position_prefix: str
    label: str
    records: int
    source: dict[str, Any]
    base: int = 0
    size: int = 0
    location: str = "{label}:{offset}"
    span: str = ""

    @property
    def title(self) -> str:
        """The unit for people: its label and span (``events-0 [100, 200)``)."""
        return f"{self.label} {self.span}" if self.span else self.label

    def position(self, offset: int) -> str:
        """The position text of the record at ``offset`` (what keys and rejects carry)."""
        return f"{self.position_prefix}{offset}"

    def locate(self, offset: int) -> str:
        """Where the record at ``offset`` is, for an error message."""
        return self.location.format(label=self.label, offset=offset)


@runtime_checkable
class Slice(Protocol):
    """What one Spark task reads. Picklable: it travels to the executors with the plan."""

    @property
    def unit_ids(self) -> tuple[str, ...]:
        """The units this slice reads records of."""
        ...

    def read(
        self, index_of: Mapping[str, int], *, max_record_bytes: int, limit: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Yield the slice's records as :data:`RECORDS_SCHEMA` batches (runs on executors).

        Args:
            index_of: unit id -> its index in the batch (the ``_unit`` column).
            max_record_bytes: longer records are cut to their head; ``_raw_length``
                keeps their true length (the coercion rejects them).
            limit: stop after about this many records (a bounded driver-side sample).
        """
        ...


class CommitStep(Protocol):
    """Source state that moves with the rows, inside the one applying transaction."""

    def restricted_to(self, unit_keys: Collection[str]) -> CommitStep | None:
        """The step for only these units (others turned out committed); ``None`` if empty."""
        ...

    def apply(self, conn: psycopg.Connection, commit_id: str, max_timestamps: Mapping[str, int]) -> dict[str, Any]:
        """Run inside the applying transaction; return fields for the commit's result.

        ``max_timestamps`` maps a unit id to the newest source timestamp read
        from it (epoch ms). A returned ``valid_through`` (a datetime) goes to
        ``idem.commits.valid_through``.

        Raises:
            SourceMoved: another run already moved the source's state; nothing commits.
        """
        ...

    def after_commit(self, result: dict[str, Any]) -> dict[str, Any]:
        """Best effort, after COMMIT: never raises; returns fields for the result."""
        ...

    # Optional: ``record_rejects(conn, plan, stages) -> int``. A step that has it keeps the
    # batch's rejects itself, inside the applying transaction, instead of new
    # ``idem.rejects`` rows (the quarantine's retry hands still-failing rejects back);
    # ``stages`` are the accepted attempts' reject tables; it returns how many it kept.


@dataclass(frozen=True)
class SourceBatch:
    """A planned batch of one connector: units to read, units already committed (replays).

    Small and picklable (the ``ingest`` asset's value): the records themselves are
    read by the executors, slice by slice, when the batch is committed.
    """

    connector: str
    kind: str
    pending: tuple[Unit, ...]
    slices: tuple[Slice, ...]
    replayed: tuple[Unit, ...] = ()
    priors: dict[str, dict[str, Any]] = field(default_factory=dict)
    step: CommitStep | None = None
    planned_at: str = ""
    notes: tuple[str, ...] = ()

    @property
    def units(self) -> tuple[Unit, ...]:
        return self.replayed + self.pending

    @property
    def fully_replayed(self) -> bool:
        return not self.pending

    @property
    def empty(self) -> bool:
        """Nothing was waiting at the source (no unit at all)."""
        return not self.pending and not self.replayed

    def index_of(self) -> dict[str, int]:
        """Pending unit id -> its index (the ``_unit`` column of the records)."""
        return {unit.id: index for index, unit in enumerate(self.pending)}

    def with_committed(self, priors: Mapping[str, dict[str, Any]]) -> SourceBatch:
        """This batch after the units whose keys are in ``priors`` turned out committed.

        Their slices go; the step keeps only the units still pending.
        """
        done = set(priors)
        if not done & {u.key for u in self.pending}:
            return self
        pending = tuple(u for u in self.pending if u.key not in done)
        ids = {u.id for u in pending}
        merged = {**self.priors, **priors}
        step = self.step.restricted_to({u.key for u in pending}) if self.step is not None else None
        return replace(
            self,
            pending=pending,
            slices=tuple(s for s in (_restricted(s, ids) for s in self.slices) if s is not None),
            replayed=self.replayed + tuple(u for u in self.pending if u.key in done),
            priors=merged,
            step=step,
        )

    def metadata(self) -> dict[str, Any]:
        """What the ``ingest`` asset reports, in the source's own words (files and lines, ranges and messages)."""
        units, keys, records, slices = _NOUNS.get(self.kind, _NOUNS[""])
        return {
            units: [u.title for u in self.units],
            keys: [u.key for u in self.units],
            "bytes": sum(u.size for u in self.units),
            records: sum(u.records for u in self.units),
            slices: len(self.slices),
            "already_committed": [u.title for u in self.replayed],
            **({"notes": list(self.notes)} if self.notes else {}),
        }


def _restricted(piece: Slice, ids: set[str]) -> Slice | None:
    """``piece`` reading only units in ``ids``: itself, the part a slice spanning several
    units keeps (``restricted_to``), or ``None`` when nothing of it is left to read."""
    if set(piece.unit_ids) <= ids:
        return piece
    restrict = getattr(piece, "restricted_to", None)
    return restrict(ids) if restrict is not None else None


_NOUNS = {
    "": ("units", "ledger_keys", "records", "slices"),
    "filedrop": ("files", "file_keys", "lines", "splits"),
    "kafka": ("ranges", "ledger_keys", "messages", "slices"),
    "rejects": ("rejected_sources", "ledger_keys", "rejects", "slices"),
}
