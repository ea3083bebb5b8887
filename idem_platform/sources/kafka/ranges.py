"""Plan a Kafka batch: per partition, the offsets from the committed one to the end the brokers report.

Each partition with lag is one unit: ledger key ``kafka:<topic>-<partition>@<committed>``,
positions ``<topic>-<partition>@<offset>``. Its range is cut into slices of at
most ``split_records`` offsets (one Spark task each), about eight in all so a
small run still uses every core. The commit step moves ``idem.source_offsets``
from the committed offsets to the ranges' ends inside the applying transaction.

Explicit ranges (what the sensor requests) are checked against the committed
offsets: a range that starts where the partition is committed is read; one
that starts below is already committed (a replay); one that starts above would
skip offsets and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from idem_platform.config import KafkaConnector
from idem_platform.errors import ConfigError, OffsetGapError, TerminalError
from idem_platform.ledger import Ledger, LedgerEntry
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import SCHEMA
from idem_platform.sources.kafka.client import (
    PartitionState,
    describe_partitions,
    reader_settings,
)
from idem_platform.sources.kafka.offsets import OffsetAdvance, OffsetRange, committed_offsets
from idem_platform.sources.kafka.reader import KafkaSlice
from idem_platform.write.batch import SourceBatch, Unit

TARGET_SLICES = 8
MIN_SLICE_RECORDS = 10_000


@dataclass(frozen=True)
class RangeRequest:
    """A range asked for explicitly (the sensor's run config): ``[start, end)`` of a partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.partition < 0 or self.start < 0 or self.end < self.start:
            raise ConfigError(f"range {self.topic}-{self.partition} [{self.start}, {self.end}) is not a range of offsets")


def ranges_to_read(
    connector: KafkaConnector,
    committed: Mapping[tuple[str, int], int],
    states: Mapping[tuple[str, int], PartitionState],
) -> tuple[list[OffsetRange], list[str]]:
    """Every lagging partition's range from its committed offset to its end (capped per run).

    Returns:
        ``(ranges, held)``: the ranges to read now, and why other partitions
        cannot be read (retention deleted offsets that were never ingested and
        ``offset_gap`` is ``fail``; a committed offset past the partition's end).
    """
    held: list[str] = []
    lagging: list[tuple[PartitionState, int, int | None]] = []
    for key, state in sorted(states.items()):
        expected = committed.get(key)
        if expected is None:
            start = state.low if connector.start_offset == "earliest" else state.high
        elif expected < state.low:
            if connector.offset_gap == "fail":
                held.append(
                    f"{state.topic}-{state.partition}: committed offset {expected} is below the log start "
                    f"{state.low} (retention deleted {state.low - expected} messages before they were "
                    "ingested; offset_gap: skip goes on from the log start and records the gap)"
                )
                continue
            start = state.low
        elif expected > state.high:
            held.append(
                f"{state.topic}-{state.partition}: committed offset {expected} is past the partition's end "
                f"{state.high} (was the topic deleted and created again? idem.source_offsets keeps the old offsets)"
            )
            continue
        else:
            start = expected
        if state.high > start:
            lagging.append((state, start, expected))
    cap = None
    if connector.max_records_per_run is not None and lagging:
        cap = max(1, connector.max_records_per_run // len(lagging))
    ranges = [
        OffsetRange(s.topic, s.partition, start, s.high if cap is None else min(s.high, start + cap), expected)
        for s, start, expected in lagging
    ]
    return ranges, held


def gap_notes(ranges: Sequence[OffsetRange]) -> list[str]:
    """What a batch says about offsets it skipped (``offset_gap: skip``)."""
    return [f"{r.unit_id}: skipped offsets [{r.gap[0]}, {r.gap[1]}) deleted by retention" for r in ranges if r.gap]


def check_requests(
    connector: KafkaConnector,
    requests: Sequence[RangeRequest],
    committed: Mapping[tuple[str, int], int],
    states: Mapping[tuple[str, int], PartitionState],
) -> list[OffsetRange]:
    """Explicit ranges as :class:`OffsetRange`: contiguous with what is committed, or refused.

    A range that starts below the committed offset keeps its own start: its
    ledger key says whether it was committed (a replay); if not, it is dropped.

    Raises:
        TerminalError: a range would skip offsets, or names an unknown partition.
    """
    ranges: list[OffsetRange] = []
    for request in requests:
        key = (request.topic, request.partition)
        if request.topic not in (connector.topics or []):
            raise ConfigError(f"topic {request.topic!r} is not one of connector {connector.name!r}'s topics")
        state = states.get(key)
        if state is None:
            raise TerminalError(f"{request.topic}-{request.partition}: no such partition")
        expected = committed.get(key)
        if expected is None:
            if request.start < state.low or (connector.start_offset == "earliest" and request.start != state.low):
                raise TerminalError(
                    f"{request.topic}-{request.partition} has no committed offset and its log starts at "
                    f"{state.low}: a range from {request.start} would "
                    + ("read deleted offsets" if request.start < state.low else f"skip offsets [{state.low}, {request.start})")
                )
        elif request.start > expected:
            if not (connector.offset_gap == "skip" and expected < state.low and request.start == state.low):
                raise TerminalError(
                    f"{request.topic}-{request.partition} is committed up to offset {expected}: a range from "
                    f"{request.start} would skip offsets [{expected}, {request.start})"
                )
        elif request.start < expected:
            expected = request.start  # an old range: replayed if its ledger key committed
        if request.end > state.high:
            raise TerminalError(
                f"{request.topic}-{request.partition}: the range ends at {request.end}, past the end a "
                f"read_committed reader can reach ({state.high})"
            )
        if request.end > request.start:
            ranges.append(OffsetRange(request.topic, request.partition, request.start, request.end, expected))
    return ranges


def range_unit(connector: KafkaConnector, piece: OffsetRange) -> Unit:
    """A range as a unit: positions ``<topic>-<partition>@<offset>``."""
    source = {"topic": piece.topic, "partition": piece.partition, "start": piece.start, "end": piece.end, "key": piece.key}
    if piece.gap:
        source["skipped"] = list(piece.gap)
    return Unit(
        id=piece.unit_id,
        key=piece.key,
        request={
            "connector": connector.name,
            "topic": piece.topic,
            "partition": piece.partition,
            "from": piece.start if piece.expected is None else piece.expected,
        },
        position_prefix=f"{piece.topic}-{piece.partition}@",
        label=piece.unit_id,
        records=piece.end - piece.start,
        source=source,
        base=piece.start,
        location="{label}@{offset}",
        span=f"[{piece.start}, {piece.end})",
    )


def slices_of(connector: KafkaConnector, ranges: Sequence[OffsetRange]) -> list[KafkaSlice]:
    """Cut the ranges into tasks: at most ``split_records`` offsets, about :data:`TARGET_SLICES` in all."""
    total = sum(r.end - r.start for r in ranges)
    size = min(connector.split_records, max(MIN_SLICE_RECORDS, -(-total // TARGET_SLICES)))
    settings = reader_settings(connector)
    slices = []
    for piece in ranges:
        for start in range(piece.start, piece.end, size):
            slices.append(
                KafkaSlice(
                    unit=piece.unit_id,
                    topic=piece.topic,
                    partition=piece.partition,
                    start=start,
                    end=min(piece.end, start + size),
                    settings=settings,
                    read_timeout_seconds=connector.read_timeout_seconds,
                )
            )
    return slices


def _split_committed(
    ledger: Ledger, connector: str, ranges: Sequence[OffsetRange]
) -> tuple[list[OffsetRange], list[tuple[OffsetRange, dict[str, Any]]]]:
    """The ranges still to read, and the committed ones (replays) with their ledger results.

    A range whose ledger key is committed is a replay. But a partition with no committed
    offset (``idem.source_offsets`` rows removed, to read a topic again) plans from its
    first offset to its end, while the commit that first read it may have ended earlier:
    the key names the start only. Then the committed ranges are followed through the
    ledger (each one's end is the next one's start) and what lies past the last one is
    read: without this, such a partition replayed its first commit on every run and
    never read a message produced after it. A partition whose committed ranges reach its
    end gets its offset back (:func:`_restore_offset`).
    """
    entries = ledger.entries(sorted({r.key for r in ranges}))
    pending: list[OffsetRange] = []
    replayed: list[tuple[OffsetRange, dict[str, Any]]] = []
    for piece in ranges:
        entry: LedgerEntry | None = entries.get(piece.key)
        while entry is not None and entry.status == "committed":
            result = entry.result or {}
            end = _committed_end(result, piece.key)
            if piece.expected is not None or end is None or end <= piece.start or end >= piece.end:
                replayed.append((piece, result))
                if piece.expected is None and end is not None and end >= piece.end:
                    _restore_offset(ledger.conn, connector, piece, end, result)
                break
            replayed.append((OffsetRange(piece.topic, piece.partition, piece.start, end, None), result))
            piece = OffsetRange(piece.topic, piece.partition, end, piece.end, None)
            entry = ledger.entries([piece.key]).get(piece.key)
        else:
            pending.append(piece)
    return pending, replayed


def _restore_offset(conn: psycopg.Connection, connector: str, piece: OffsetRange, end: int, result: Mapping[str, Any]) -> None:
    """Write back the offset a partition without one had when its last committed range ended.

    The ledger's committed range says where the commit that read it left the partition
    (``end``, by commit ``result["commit_id"]``): the row that was removed. Without it, the
    partition would stay a replay, planned from its first offset, until its next message.
    ``ON CONFLICT DO NOTHING``: a run that commits the partition meanwhile wins.
    """
    commit_id = result.get("commit_id")
    if not isinstance(commit_id, str):
        return
    conn.execute(
        f"INSERT INTO {SCHEMA}.source_offsets (connector, topic, partition, next_offset, commit_id) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connector, topic, partition) DO NOTHING",
        [connector, piece.topic, piece.partition, end, commit_id],
    )


def _committed_end(result: Mapping[str, Any], key: str) -> int | None:
    """The end offset of the range ``key`` a commit's ledger result records, if it does."""
    for name in ("sources", "files"):
        for entry in result.get(name) or []:
            if isinstance(entry, Mapping) and entry.get("key") == key and isinstance(entry.get("end"), int):
                return int(entry["end"])
    return None


def plan_kafka(url: str, connector: KafkaConnector, requests: Sequence[RangeRequest] | None = None) -> SourceBatch:
    """The batch of ``connector``: its lagging partitions' ranges, or the ``requests`` given.

    Raises:
        KafkaError: the brokers cannot be reached.
        OffsetGapError, TerminalError: the committed offsets and the log disagree.
    """
    only = None if requests is None else {(r.topic, r.partition) for r in requests}
    view = describe_partitions(connector, only=only)
    states = view.partitions
    with connect(url) as conn, conn.transaction():
        committed = committed_offsets(conn, connector.name)
        if requests is None:
            ranges, held = ranges_to_read(connector, committed, states)
            if held:
                raise OffsetGapError(f"connector {connector.name!r}: " + "; ".join(held))
        else:
            ranges = check_requests(connector, requests, committed, states)
        # Units in (topic, partition) order, however they were asked for: the order a commit
        # reads its ranges in is the order of their versions in an upsert table without order_by.
        ranges = sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))
        pending, replayed_ranges = _split_committed(Ledger(conn, connector.name), connector.name, ranges)
    missing = view.missing_note()
    notes = gap_notes(ranges) + ([missing] if missing else [])
    replayed = [range_unit(connector, piece) for piece, _ in replayed_ranges]
    priors = {piece.key: result for piece, result in replayed_ranges}
    stale = [r for r in pending if r.expected is not None and r.expected != committed.get((r.topic, r.partition))]
    if stale:
        notes.append(
            "already committed past the start of: "
            + ", ".join(f"{r.unit_id}@{r.start}" for r in stale)
            + " (nothing of those ranges is read again)"
        )
        pending = [r for r in pending if r not in stale]
    step = None
    if pending:
        step = OffsetAdvance(connector.name, tuple(pending), connector.group, reader_settings(connector))
    return SourceBatch(
        connector=connector.name,
        kind="kafka",
        pending=tuple(range_unit(connector, r) for r in pending),
        slices=tuple(slices_of(connector, pending)),
        replayed=tuple(replayed),
        priors=priors,
        step=step,
        planned_at=datetime.now(UTC).isoformat(),
        notes=tuple(notes),
    )
