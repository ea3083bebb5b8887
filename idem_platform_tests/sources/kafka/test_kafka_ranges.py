"""The Kafka planning rules as plain functions: which offsets a run reads, what it refuses, how it
retries. The watermarks here are data (what a broker would report), so the cases a test broker
cannot produce (retention moving the log start, a topic recreated) are covered too."""

from __future__ import annotations

import socket
import time

import pytest

from idem_platform.config import ConnectorConfig, parse_config
from idem_platform.errors import TerminalError
from idem_platform.ledger import LedgerEntry
from idem_platform.sources.kafka.client import PartitionState
from idem_platform.sources.kafka.lag import decide, partition_lags, run_key
from idem_platform.sources.kafka.offsets import OffsetAdvance, OffsetRange
from idem_platform.sources.kafka.ranges import (
    RangeRequest,
    check_requests,
    ranges_to_read,
    slices_of,
)

BASE = """
connectors:
  - name: events
    kind: kafka
    bootstrap_servers: 127.0.0.1:9092
    topics: [t]
    record_type: event
    {extra}
tables:
  event:
    columns:
      name: string
"""


def connector(extra: str = "") -> ConnectorConfig:
    return parse_config(BASE.format(extra=extra)).connector("events")


def states(*parts: tuple[int, int, int]) -> dict[tuple[str, int], PartitionState]:
    return {("t", p): PartitionState("t", p, low, high) for p, low, high in parts}


def test_every_lagging_partition_reads_from_its_committed_offset_to_its_end() -> None:
    ranges, held = ranges_to_read(connector(), {("t", 0): 10, ("t", 1): 50}, states((0, 0, 40), (1, 0, 50), (2, 5, 9)))
    assert held == []
    assert ranges == [OffsetRange("t", 0, 10, 40, 10), OffsetRange("t", 2, 5, 9, None)]  # 1 has no lag
    assert [r.key for r in ranges] == ["kafka:t-0@10", "kafka:t-2@5"]
    latest, _ = ranges_to_read(connector("start_offset: latest"), {}, states((0, 0, 40)))
    assert latest == []  # a new partition starts at its end: nothing to read yet


def test_max_records_per_run_caps_each_partition_share() -> None:
    ranges, _ = ranges_to_read(connector("max_records_per_run: 100"), {}, states((0, 0, 1000), (1, 0, 30)))
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 50), (1, 0, 30)]


def test_a_retention_gap_fails_or_is_skipped_and_recorded() -> None:
    committed = {("t", 0): 100}
    ranges, held = ranges_to_read(connector(), committed, states((0, 400, 500), (1, 0, 10)))
    assert [r.partition for r in ranges] == [1]  # the other partition is not held back
    assert held == [
        "t-0: committed offset 100 is below the log start 400 (retention deleted 300 messages before they were "
        "ingested; offset_gap: skip goes on from the log start and records the gap)"
    ]
    ranges, held = ranges_to_read(connector("offset_gap: skip"), committed, states((0, 400, 500)))
    (piece,) = ranges
    assert held == [] and (piece.start, piece.end, piece.expected, piece.gap) == (400, 500, 100, (100, 400))
    assert piece.key == "kafka:t-0@100"  # keyed by what is committed: the compare-and-set expects 100


def test_a_committed_offset_past_the_end_is_held_with_the_likely_cause() -> None:
    ranges, held = ranges_to_read(connector(), {("t", 0): 900}, states((0, 0, 10)))
    assert ranges == [] and "past the partition's end 10 (was the topic deleted and created again?" in held[0]


def test_explicit_ranges_must_start_where_the_partition_is_committed() -> None:
    c = connector()
    committed = {("t", 0): 10}
    view = states((0, 0, 40), (1, 0, 5))
    assert check_requests(c, [RangeRequest("t", 0, 10, 30)], committed, view) == [OffsetRange("t", 0, 10, 30, 10)]
    # an old range keeps its own start: its ledger key says whether it was committed
    assert check_requests(c, [RangeRequest("t", 0, 0, 10)], committed, view) == [OffsetRange("t", 0, 0, 10, 0)]
    with pytest.raises(TerminalError, match=r"would skip offsets \[10, 20\)"):
        check_requests(c, [RangeRequest("t", 0, 20, 30)], committed, view)
    with pytest.raises(TerminalError, match="past the end a read_committed reader can reach"):
        check_requests(c, [RangeRequest("t", 0, 10, 41)], committed, view)
    with pytest.raises(TerminalError, match=r"no committed offset .* skip offsets \[0, 3\)"):
        check_requests(c, [RangeRequest("t", 1, 3, 5)], committed, view)


def test_slices_cut_long_ranges_and_keep_small_ones_whole() -> None:
    c = connector("split_records: 10000")
    pieces = slices_of(c, [OffsetRange("t", 0, 0, 25_000, None), OffsetRange("t", 1, 7, 900, 7)])
    assert [(s.partition, s.start, s.end) for s in pieces] == [(0, 0, 10_000), (0, 10_000, 20_000), (0, 20_000, 25_000), (1, 7, 900)]
    assert pieces[0].settings["isolation.level"] == "read_committed" and pieces[0].settings["auto.offset.reset"] == "error"


def _entry(status: str, attempts: int = 1, retryable: bool = True) -> LedgerEntry:
    error = {"message": "boom", "retryable": retryable} if status == "failed" else None
    return LedgerEntry("k", status, attempts, "run/c", None, error, "h")


@pytest.mark.parametrize(
    ("entry", "alive", "attempt"),
    [
        (None, False, 1),
        (_entry("committed"), False, None),
        (_entry("in_progress"), True, None),
        (_entry("in_progress"), False, 2),
        (_entry("in_progress", 3), False, None),
        (_entry("failed"), False, 2),
        (_entry("failed", retryable=False), False, None),
        (_entry("failed", 3), False, None),
    ],
)
def test_the_sensor_rule_per_range(entry: LedgerEntry | None, alive: bool, attempt: int | None) -> None:
    decision = decide(OffsetRange("t", 0, 5, 9, 5), entry, alive, max_attempts=3)
    assert decision.attempt == attempt and (decision.range is not None) == (attempt is not None)


def test_run_keys_name_ranges_and_attempts_and_stay_short() -> None:
    decisions = [decide(OffsetRange("t", p, 0, 10, None), None, False, 3) for p in (1, 0)]
    assert run_key("events", decisions) == "events:t-0@0..10#1,t-1@0..10#1"
    many = [decide(OffsetRange("t", p, 0, 10, None), None, False, 3) for p in range(50)]
    assert run_key("events", many).startswith("events:50 ranges:") and len(run_key("events", many)) < 60


def test_lag_counts_from_the_committed_offset_or_the_log_start() -> None:
    lags = partition_lags(states((0, 0, 40), (1, 5, 9)), {("t", 0): 10})
    assert [(lag.partition, lag.committed, lag.lag) for lag in lags] == [(0, 10, 30), (1, None, 4)]


def test_mirroring_offsets_to_a_group_never_fails_the_run() -> None:
    """After the PostgreSQL commit the offsets go to the consumer group for lag tools; with no
    broker listening, the step reports the failure in the result within seconds and raises nothing."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    step = OffsetAdvance("events", (OffsetRange("t", 0, 0, 5, None),), "idem-events", {"bootstrap.servers": f"127.0.0.1:{port}"})
    started = time.monotonic()
    outcome = step.after_commit({})["consumer_group"]
    assert outcome["committed"] is False and outcome["group"] == "idem-events" and outcome["error"]
    assert time.monotonic() - started < 15
