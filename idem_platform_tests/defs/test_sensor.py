"""The file-drop sensor with build_sensor_context on a real instance and a real ledger."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.contract.keys import file_key_from_digest
from idem_platform.defs.filedrop.decisions import Decision, copies_of_committed, decide
from idem_platform.ledger import Ledger, LedgerEntry
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform.sources.filedrop import file_unit
from idem_platform.sources.filedrop.files import hash_file
from idem_platform_tests.helpers.filedrop import drop_dir
from idem_platform_tests.helpers.sensors import SensorTicker


@pytest.fixture
def ticker(threatfeed: IdemConfig, instance: dg.DagsterInstance, pg_url: str) -> SensorTicker:
    return SensorTicker(threatfeed, instance, pg_url, "threatfeed_filedrop_sensor")


def skip_message(result: dg.SensorResult) -> str:
    return (result.skip_reason.skip_message or "") if result.skip_reason else ""


def record_ledger(
    pg_url: str, key: str, status: str, *, attempts: int = 1, retryable: bool = True, owner: str | None = None
) -> None:
    """A ledger row as a commit of this file alone leaves it (its own owner), unless ``owner`` is shared."""
    owner = owner or f"run-{key[-8:]}/c1"
    with connect(pg_url) as conn, conn.transaction():
        ledger = Ledger(conn, "threatfeed")
        ledger.begin(key, {"connector": "threatfeed", "file_key": key}, owner=owner)
        for _ in range(attempts - 1):
            ledger.take_over(key, owner)
        if status == "committed":
            ledger.commit(key, {"commit_id": "c1"}, owner=owner)
        elif status == "failed":
            ledger.fail_permanent(key, {"class": "X", "message": "boom", "retryable": retryable}, owner=owner)


def test_new_file_is_requested_once_it_has_settled(ticker: SensorTicker, threatfeed: IdemConfig) -> None:
    path = write_lines(drop_dir(threatfeed) / "day1.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    first = ticker.tick()
    assert first.run_requests == [] and "waiting to settle" in skip_message(first)
    second = ticker.tick()
    (request,) = second.run_requests
    sha = hash_file(path).sha256
    assert request.partition_key == "day1.ndjson"
    assert request.run_key == f"day1.ndjson@{sha[:16]}#1"
    assert request.run_config == {"ops": {"threatfeed__ingest": {"config": {"files": [str(path)]}}}}
    assert request.tags["idem/file_key"] == f"filedrop:{sha}"
    assert second.dynamic_partitions_requests[0].partition_keys == ["day1.ndjson"]
    cursor = json.loads(second.cursor or "{}")
    assert cursor["files"]["day1.ndjson"][4] == sha
    # Same file, next tick: the same run key again (Dagster dedups it), nothing re-hashed.
    third = ticker.tick()
    assert [r.run_key for r in third.run_requests] == [request.run_key]


def test_committed_file_requests_nothing(ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str) -> None:
    path = write_lines(drop_dir(threatfeed) / "done.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    record_ledger(pg_url, hash_file(path).key, "committed")
    ticker.tick()
    assert ticker.tick().run_requests == []


def test_a_copy_of_a_committed_file_is_named_in_the_skip_reason(
    ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str
) -> None:
    directory = drop_dir(threatfeed)
    original = write_lines(directory / "feed-001.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    key = hash_file(original).key
    with connect(pg_url) as conn, conn.transaction():
        ledger = Ledger(conn, "threatfeed")
        ledger.begin(key, {"connector": "threatfeed", "file_key": key}, owner="run-1/c1")
        ledger.commit(key, {"commit_id": "c1", "files": [{"file": str(original.resolve()), "key": key}]}, owner="run-1/c1")
    write_lines(directory / "feed-003.ndjson", ['{"type":"malware","id":1,"name":"a"}'])  # the same bytes
    ticker.tick()
    result = ticker.tick()
    assert result.run_requests == []
    assert "feed-003.ndjson: same content as committed feed-001.ndjson" in skip_message(result)
    assert "feed-001.ndjson:" not in skip_message(result)  # the original is simply committed


def test_the_drop_directory_is_created_by_the_first_tick(ticker: SensorTicker, threatfeed: IdemConfig) -> None:
    directory = threatfeed.connector("threatfeed").path
    assert directory is not None and not directory.exists()
    assert "0 file(s)" in skip_message(ticker.tick()) and directory.is_dir()


def test_fifos_and_symlinks_out_of_the_drop_directory_are_refused_quickly(
    ticker: SensorTicker, threatfeed: IdemConfig, tmp_path: Path
) -> None:
    directory = drop_dir(threatfeed)
    os.mkfifo(directory / "pipe.ndjson")  # hashing it would block the tick for ever
    secret = tmp_path / "outside" / "secret.ndjson"
    write_lines(secret, ['{"type":"malware","id":1,"name":"not yours"}'])
    (directory / "link.ndjson").symlink_to(secret)
    started = time.monotonic()
    ticker.tick()
    result = ticker.tick()
    assert time.monotonic() - started < 5 and result.run_requests == []
    message = skip_message(result)
    assert "pipe.ndjson: a FIFO, not read" in message
    assert f"link.ndjson: a symlink out of the drop directory (to {secret.resolve()}), not read" in message


@pytest.mark.slow
def test_the_cursor_keeps_only_files_not_committed_with_ten_thousand_files_dropped(
    ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str
) -> None:
    """Committed files are known from the ledger (path, size, mtime), not from the cursor:
    the cursor stays the size of what is pending, however many files the directory keeps."""
    directory = drop_dir(threatfeed)
    hashed = []
    for index in range(10_000):
        path = write_lines(directory / f"d{index // 1000}" / f"f{index}.ndjson", [f'{{"type":"malware","id":{index},"name":"m"}}'])
        hashed.append(hash_file(path))
    with connect(pg_url) as conn, conn.transaction():
        ledger = Ledger(conn, "threatfeed")
        for file in hashed:
            ledger.begin(file.key, {"connector": "threatfeed", "file_key": file.key}, owner="run/c")
            result = {"commit_id": "c", "files": [file_unit("threatfeed", file).source]}
            ledger.commit(file.key, result, owner="run/c")
    started = time.monotonic()
    first = ticker.tick()
    tick_seconds = time.monotonic() - started
    assert first.run_requests == [] and "10000 file(s): 10000 committed, 0 settled" in skip_message(first)
    assert json.loads(ticker.cursor or "{}")["files"] == {}
    assert tick_seconds < 20, f"a tick over 10,000 committed files took {tick_seconds:.1f}s"
    for index in range(3):
        write_lines(directory / f"new-{index}.ndjson", [f'{{"type":"malware","id":"n{index}","name":"m"}}'])
    ticker.tick()
    (batch,) = ticker.tick().run_requests  # the three new files, one run
    assert batch.tags["idem/files"] == "3"
    assert sorted(json.loads(ticker.cursor or "{}")["files"]) == ["new-0.ndjson", "new-1.ndjson", "new-2.ndjson"]
    # A committed file rewritten in place is not the committed file any more: it is looked at again.
    rewritten = write_lines(directory / "d0" / "f7.ndjson", ['{"type":"malware","id":"other","name":"m"}'])
    ticker.tick()
    assert "d0/f7.ndjson" in json.loads(ticker.cursor or "{}")["files"] and rewritten.exists()


def test_a_committed_file_rewritten_with_its_size_and_mtime_restored_is_ingested_again(
    ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str
) -> None:
    path = write_lines(drop_dir(threatfeed) / "same.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    file = hash_file(path)
    with connect(pg_url) as conn, conn.transaction():
        ledger = Ledger(conn, "threatfeed")
        ledger.begin(file.key, {"connector": "threatfeed", "file_key": file.key}, owner="run/c")
        ledger.commit(file.key, {"commit_id": "c", "files": [file_unit("threatfeed", file).source]}, owner="run/c")
    assert "1 committed" in skip_message(ticker.tick())
    stat = path.stat()
    path.write_text('{"type":"malware","id":2,"name":"b"}\n')  # same size, other bytes
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime put back
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    ticker.tick()
    (request,) = ticker.tick().run_requests
    assert request.tags["idem/file_key"] == hash_file(path).key != file.key


def test_half_written_and_hidden_files_are_not_requested(ticker: SensorTicker, threatfeed: IdemConfig) -> None:
    directory = drop_dir(threatfeed)
    growing = directory / "growing.ndjson"
    growing.write_text('{"type":"malware","id":1,"name":"a"}\n')
    (directory / ".hidden.ndjson").write_text('{"type":"malware","id":2,"name":"b"}\n')
    (directory / "upload.ndjson.part").write_text('{"type":"malware","id":3,"name":"c"}\n')
    ticker.tick()
    with growing.open("a") as handle:  # the writer is still appending
        handle.write('{"type":"malware","id":2,"name":"b"}\n')
    assert ticker.tick().run_requests == []
    (request,) = ticker.tick().run_requests  # unchanged across two looks now
    assert request.partition_key == "growing.ndjson"


def test_failed_file_is_retried_with_a_new_run_key(ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str) -> None:
    path = write_lines(drop_dir(threatfeed) / "flaky.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    sha = hash_file(path).sha256
    record_ledger(pg_url, f"filedrop:{sha}", "failed", attempts=1, retryable=True)
    ticker.tick()
    (request,) = ticker.tick().run_requests
    assert request.run_key == f"flaky.ndjson@{sha[:16]}#2" and request.tags["idem/attempt"] == "2"


def test_permanent_failures_and_exhausted_retries_are_held(ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str) -> None:
    directory = drop_dir(threatfeed)
    bad = write_lines(directory / "bad.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    tired = write_lines(directory / "tired.ndjson", ['{"type":"malware","id":2,"name":"b"}'])
    record_ledger(pg_url, hash_file(bad).key, "failed", retryable=False)
    record_ledger(pg_url, hash_file(tired).key, "failed", attempts=3, retryable=True)
    ticker.tick()
    result = ticker.tick()
    assert result.run_requests == []
    assert "bad.ndjson: failed permanently: boom" in skip_message(result)
    assert "tired.ndjson: failed 3 times" in skip_message(result)


def test_in_progress_file_waits_for_a_live_run_and_is_taken_over_from_a_dead_one(
    ticker: SensorTicker, threatfeed: IdemConfig, pg_url: str
) -> None:
    path = write_lines(drop_dir(threatfeed) / "busy.ndjson", ['{"type":"malware","id":1,"name":"a"}'])
    key = hash_file(path).key
    record_ledger(pg_url, key, "in_progress")
    ticker.tick()
    with connect(pg_url, autocommit=True) as holder:  # a live run holds the file's advisory lock
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [f"idem:threatfeed:{key}"])
        assert ticker.tick().run_requests == []
    (request,) = ticker.tick().run_requests  # the holder is gone: its run died
    assert request.run_key.endswith("#2")


@pytest.mark.parametrize(
    ("status", "attempts", "alive", "error", "expected"),
    [
        (None, 0, False, None, 1),
        ("committed", 1, False, None, None),
        ("in_progress", 1, True, None, None),
        ("in_progress", 1, False, None, 2),
        ("in_progress", 3, False, None, None),
        ("failed", 1, False, {"retryable": True}, 2),
        ("failed", 3, False, {"retryable": True}, None),
        ("failed", 1, False, {"retryable": False}, None),
    ],
)
def test_decide(status: str | None, attempts: int, alive: bool, error: dict | None, expected: int | None) -> None:
    entry = None if status is None else LedgerEntry("k", status, attempts, "o", None, error, "h")
    assert decide("f", "ab" * 32, entry, alive, max_attempts=3).attempt == expected


def test_copies_of_committed_names_nothing_for_a_committed_decision_without_its_ledger_row(
    tmp_path: Path,
) -> None:
    """The skip-reason notes survive a decision whose ledger row is absent (or has no result):
    the old `if entry is not None` sat inside the comprehension, after `entry.result` was read."""
    sha = "ab" * 32
    committed = Decision("copy.ndjson", sha, None, "committed")
    assert copies_of_committed(tmp_path, [committed], {}) == []
    row = LedgerEntry(file_key_from_digest(sha), "committed", 1, "o", None, None, "h")
    assert copies_of_committed(tmp_path, [committed], {row.key: row}) == []
