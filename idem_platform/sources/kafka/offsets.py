"""``idem.source_offsets``: the offsets that count, moved only inside the rows' transaction.

A run plans each partition's range from the committed ``next_offset`` (its
*expected start*). The applying transaction then advances the row with a
compare-and-set, ``WHERE next_offset = <expected start>``: of two runs of one
range, exactly one moves it; the other's transaction rolls back with its rows
(:class:`~idem_platform.errors.SourceMoved`), so a crash or a race anywhere
replays nothing twice and skips nothing.

After COMMIT the same offsets are mirrored to the connector's consumer group so
that lag tools (``kafka-consumer-groups``, Burrow...) see them; that mirror is
best effort and never fails a run.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from idem_platform.errors import SourceMoved
from idem_platform.postgres.schema import SCHEMA
from idem_platform.sources.kafka.client import consumer

GROUP_COMMIT_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, planned from the committed ``expected`` offset.

    ``expected`` is ``None`` for a partition with no committed offset yet; it is
    below ``start`` when retention deleted ``[expected, start)`` and the
    connector's ``offset_gap`` policy is ``skip``.
    """

    topic: str
    partition: int
    start: int
    end: int
    expected: int | None

    @property
    def unit_id(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def key(self) -> str:
        """The ledger key: the partition and the committed offset the range starts from.

        Two runs from the same committed offset share it, whatever their ends:
        one waits for the other and then replays its result.
        """
        return f"kafka:{self.topic}-{self.partition}@{self.start if self.expected is None else self.expected}"

    @property
    def gap(self) -> tuple[int, int] | None:
        """Offsets skipped because retention deleted them, if any."""
        if self.expected is not None and self.expected < self.start:
            return (self.expected, self.start)
        return None


def committed_offsets(conn: psycopg.Connection, connector: str) -> dict[tuple[str, int], int]:
    """``{(topic, partition): next_offset}`` of every partition the connector has committed."""
    rows = conn.execute(
        f"SELECT topic, partition, next_offset FROM {SCHEMA}.source_offsets WHERE connector = %s",
        [connector],
    ).fetchall()
    return {(topic, partition): int(offset) for topic, partition, offset in rows}


def offset_rows(conn: psycopg.Connection, connector: str | None = None) -> list[dict[str, Any]]:
    """The committed offsets with their commit (for ``idem offsets``)."""
    rows = conn.execute(
        f"SELECT connector, topic, partition, next_offset, commit_id::text, updated_at FROM {SCHEMA}.source_offsets "
        "WHERE %(connector)s::text IS NULL OR connector = %(connector)s ORDER BY connector, topic, partition",
        {"connector": connector},
    ).fetchall()
    keys = ("connector", "topic", "partition", "next_offset", "commit_id", "updated_at")
    return [dict(zip(keys, row, strict=True)) for row in rows]


@dataclass(frozen=True)
class OffsetAdvance:
    """The Kafka commit step: compare-and-set each range's offset, then mirror to the group."""

    connector: str
    ranges: tuple[OffsetRange, ...]
    group: str
    settings: dict[str, Any]

    def restricted_to(self, unit_keys: Collection[str]) -> OffsetAdvance | None:
        kept = tuple(r for r in self.ranges if r.key in unit_keys)
        return replace(self, ranges=kept) if kept else None

    def apply(self, conn: psycopg.Connection, commit_id: str, max_timestamps: Mapping[str, int]) -> dict[str, Any]:
        """Advance every range's partition from its expected start to its end (inside the commit).

        Raises:
            SourceMoved: a partition is not where this run planned from.
        """
        for piece in sorted(self.ranges, key=lambda r: (r.topic, r.partition)):
            if piece.expected is None:
                moved = conn.execute(
                    f"INSERT INTO {SCHEMA}.source_offsets (connector, topic, partition, next_offset, commit_id) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connector, topic, partition) DO NOTHING",
                    [self.connector, piece.topic, piece.partition, piece.end, commit_id],
                ).rowcount
            else:
                moved = conn.execute(
                    f"UPDATE {SCHEMA}.source_offsets SET next_offset = %s, commit_id = %s, updated_at = now() "
                    "WHERE connector = %s AND topic = %s AND partition = %s AND next_offset = %s",
                    [piece.end, commit_id, self.connector, piece.topic, piece.partition, piece.expected],
                ).rowcount
            if moved != 1:
                raise SourceMoved(self._moved_message(conn, piece))
        stamps = [max_timestamps[r.unit_id] for r in self.ranges if r.unit_id in max_timestamps]
        return {
            # The newest message every partition of the run has reached: the data is
            # complete up to this moment on all of them (DESIGN §4 valid_through).
            "valid_through": datetime.fromtimestamp(min(stamps) / 1000, UTC) if stamps else None,
            "offsets": [
                {"topic": r.topic, "partition": r.partition, "from": r.start, "to": r.end}
                | ({"skipped": list(r.gap)} if r.gap else {})
                for r in self.ranges
            ],
        }

    def _moved_message(self, conn: psycopg.Connection, piece: OffsetRange) -> str:
        row = conn.execute(
            f"SELECT next_offset FROM {SCHEMA}.source_offsets WHERE connector = %s AND topic = %s AND partition = %s",
            [self.connector, piece.topic, piece.partition],
        ).fetchone()
        found = None if row is None else int(row[0])
        planned = "no committed offset" if piece.expected is None else f"offset {piece.expected}"
        if found is not None and (piece.expected is None or found > piece.expected):
            return (
                f"range already committed: {piece.unit_id} is at offset {found}, this run planned "
                f"[{piece.start}, {piece.end}) from {planned}; nothing was committed"
            )
        return (
            f"{piece.unit_id} is at {'no offset' if found is None else f'offset {found}'}, not at {planned} as "
            "this run planned (were idem.source_offsets edited?); nothing was committed"
        )

    def after_commit(self, result: dict[str, Any]) -> dict[str, Any]:
        """Mirror the new offsets to the consumer group; never raises, never waits long."""
        outcome: dict[str, Any] = {"group": self.group, "committed": False}

        def mirror() -> None:
            try:
                commit_to_group(self.settings, self.group, [(r.topic, r.partition, r.end) for r in self.ranges])
                outcome["committed"] = True
            except Exception as exc:  # noqa: BLE001 - lag tools only: the data is committed
                outcome["error"] = f"{type(exc).__name__}: {exc}"[:300]

        worker = threading.Thread(target=mirror, name="idem-kafka-group-commit", daemon=True)
        worker.start()
        worker.join(GROUP_COMMIT_TIMEOUT_SECONDS)
        if worker.is_alive():
            outcome["error"] = f"no answer within {GROUP_COMMIT_TIMEOUT_SECONDS:.0f}s"
        return {"consumer_group": outcome}


def commit_to_group(settings: dict[str, Any], group: str, offsets: list[tuple[str, int, int]]) -> None:
    """Commit ``(topic, partition, next offset)`` to ``group`` without joining it."""
    # Late import (confluent_kafka): off idem --help's imports and file-only runs'.
    from confluent_kafka import TopicPartition

    # session.timeout.ms bounds how long a commit waits for a coordinator (45 s by default).
    client = consumer({**settings, "group.id": group, "session.timeout.ms": 6000})
    try:
        client.commit(offsets=[TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=False)
    finally:
        client.close()
