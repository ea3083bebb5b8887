"""Which Kafka ranges need a run, and why the others wait: the sensor's rule, without Dagster.

Per partition: the committed offset (``idem.source_offsets``), the brokers'
watermarks, and the ledger row of the range starting there (its key is the
partition and the committed offset). A partition with lag is requested when
no row exists, when its run died (``in_progress`` and nobody holds its lock)
or when it failed with a retryable error and has attempts left. The attempt
number goes into the run key, so a failed range is retried with a new key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from idem_platform.ledger import LedgerEntry, next_attempt
from idem_platform.sources.kafka.client import PartitionState
from idem_platform.sources.kafka.offsets import OffsetRange


@dataclass(frozen=True)
class PartitionLag:
    """One partition as the sensor (and ``idem offsets``) sees it."""

    topic: str
    partition: int
    committed: int | None
    low: int
    high: int

    @property
    def lag(self) -> int:
        """Offsets not committed yet (from the log start when nothing is)."""
        return max(0, self.high - max(self.low, self.committed if self.committed is not None else self.low))


def partition_lags(states: Mapping[tuple[str, int], PartitionState], committed: Mapping[tuple[str, int], int]) -> list[PartitionLag]:
    return [
        PartitionLag(s.topic, s.partition, committed.get(key), s.low, s.high) for key, s in sorted(states.items())
    ]


@dataclass(frozen=True)
class RangeDecision:
    """What to do about one partition: a range and its attempt, or a reason to wait."""

    partition: str  # <topic>-<partition>
    range: OffsetRange | None
    attempt: int | None
    reason: str


def decide(piece: OffsetRange, entry: LedgerEntry | None, alive: bool, max_attempts: int) -> RangeDecision:
    """The ledger-driven rule for one range (the key of its committed start), as a pure function."""
    attempt, reason = next_attempt(entry, alive=alive, max_attempts=max_attempts, new="new offsets")
    return RangeDecision(piece.unit_id, piece if attempt is not None else None, attempt, reason)


def decide_all(
    ranges: list[OffsetRange], entries: Mapping[str, LedgerEntry], alive: Collection[str], max_attempts: int
) -> list[RangeDecision]:
    return [decide(r, entries.get(r.key), r.key in alive, max_attempts) for r in ranges]


def run_key(connector: str, decisions: list[RangeDecision]) -> str:
    """The run key of a request: its ranges and their attempts (a retry gets a new key)."""
    parts = sorted(
        f"{d.range.unit_id}@{d.range.start}..{d.range.end}#{d.attempt}" for d in decisions if d.range is not None
    )
    text = ",".join(parts)
    readable = f"{connector}:{text}"
    return readable if len(readable) <= 200 else f"{connector}:{len(parts)} ranges:{hashlib.sha1(text.encode()).hexdigest()[:20]}"
