"""Locks and liveness of the commit (issue 17): target tables are locked only while
applying, every lock wait is bounded, a run that lost its claim replays, and every
record of a mixed batch is counted."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.errors import TransientError
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform.write.apply.locks import ALTER_TRY_SECONDS, LockTimeout
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database

TWO_FEEDS = """
connectors:
  - name: feed-a
    kind: filedrop
    path: drop/a
    record_type: indicator
    id_field: id
    schema_evolve: true
  - name: feed-b
    kind: filedrop
    path: drop/b
    record_type: indicator
    id_field: id
    schema_evolve: true
tables:
  indicator:
    schema_version: 1
    columns:
      name: {type: string, required: true}
      confidence: int
spark:
  master: local[2]
"""


def ingest(
    url: str,
    config: IdemConfig,
    spark: Any,
    connector_name: str,
    *paths: Path,
    progress: Callable[[str], None] | None = None,
    lock_timeout: float = 120.0,
) -> dict[str, Any]:
    connector = config.connector(connector_name)
    batch = pipeline.plan_batch(url, connector, list(paths))
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))
    request = run.CommitRequest(
        url=url, connector=connector, run_id="test", progress=progress, table_lock_timeout_seconds=lock_timeout
    )
    return run.commit_batch(request, coerced, lambda: spark)


def records(prefix: str, count: int, **extra: Any) -> list[str]:
    return [json.dumps({"id": f"{prefix}-{i}", "name": f"n{i}", "confidence": i % 100, **extra}) for i in range(count)]


def strong_locks(url: str, table: str) -> list[tuple[str, str]]:
    """Who holds a lock on ``idem.<table>`` that blocks writers or readers, as (application, mode)."""
    with connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT a.application_name, l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.relation = %s::regclass AND l.granted AND l.pid <> pg_backend_pid() "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')",
            [f'idem.{table_name(table)}'],
        ).fetchall()


@pytest.fixture
def feeds(tmp_path: Path, pg_url: str) -> IdemConfig:
    reset_database(pg_url)
    config = write_config(tmp_path, TWO_FEEDS)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


def drop_path(config: IdemConfig, connector: str, name: str) -> Path:
    path = config.connector(connector).path
    assert path is not None
    return path / name


def test_staging_holds_no_lock_on_the_target_table(pg_url: str, feeds: IdemConfig, spark: Any) -> None:
    file = write_lines(drop_path(feeds, "feed-a", "one.ndjson"), records("a", 500))
    seen: list[list[tuple[str, str]]] = []

    def progress(line: str) -> None:
        if line.startswith("slice "):  # a slice is staged; finishing has not begun
            seen.append(strong_locks(pg_url, "indicator"))

    summary = ingest(pg_url, feeds, spark, "feed-a", file, progress=progress)
    assert summary["rows_written"] == 500
    assert seen and all(locks == [] for locks in seen), seen
    timings = summary["timings"]
    assert "lock_wait_seconds" in timings
    # The phases a benchmark lays out: Spark's session within prepare, COMMIT within finish.
    assert 0 <= timings["spark_session_seconds"] <= timings["prepare_seconds"]
    assert timings["commit_seconds"] <= timings["finish_seconds"]


def test_two_connectors_into_one_table_commit_while_a_reader_reads(pg_url: str, feeds: IdemConfig, spark: Any) -> None:
    # Each batch brings a new field (an evolving ALTER when it is applied) to make the
    # readers' wait as long as it can be.
    a = write_lines(drop_path(feeds, "feed-a", "a.ndjson"), records("a", 20_000, region="eu"))
    b = write_lines(drop_path(feeds, "feed-b", "b.ndjson"), records("b", 20_000, colour="red"))
    stop = threading.Event()
    latencies: list[float] = []

    def reader() -> None:
        with connect(pg_url, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                conn.execute("SELECT count(*) FROM idem.indicator").fetchone()
                latencies.append(time.monotonic() - started)
                time.sleep(0.02)

    results: dict[str, Any] = {}

    def writer(name: str, path: Path) -> None:
        try:
            results[name] = ingest(pg_url, feeds, spark, name, path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[name] = exc

    threads = [threading.Thread(target=reader)] + [
        threading.Thread(target=writer, args=args) for args in (("feed-a", a), ("feed-b", b))
    ]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join(timeout=600)
    stop.set()
    threads[0].join()
    assert all(isinstance(r, dict) for r in results.values()), results
    assert results["feed-a"]["rows_written"] == results["feed-b"]["rows_written"] == 20_000
    with connect(pg_url) as conn:
        count, regions, colours = conn.execute(
            "SELECT count(*), count(region), count(colour) FROM idem.indicator"
        ).fetchone() or (0, 0, 0)
    assert (count, regions, colours) == (40_000, 20_000, 20_000)
    # The reader kept reading throughout, and never waited longer than an apply.
    apply_seconds = max(
        r["timings"]["lock_wait_seconds"] + r["timings"]["insert_seconds"] + r["timings"]["commit_seconds"]
        for r in results.values()
    )
    assert len(latencies) >= 5  # it read throughout (a fast machine commits both in well under a second)
    assert max(latencies) <= apply_seconds + 3.0, (max(latencies), apply_seconds)  # slack for a loaded CI machine


def test_a_table_lock_held_elsewhere_ends_in_a_transient_error_then_a_retry_commits(
    pg_url: str, feeds: IdemConfig, spark: Any
) -> None:
    file = write_lines(drop_path(feeds, "feed-a", "held.ndjson"), records("h", 50))
    with connect(pg_url) as holder:
        holder.execute("LOCK TABLE idem.indicator IN SHARE MODE")  # a user's open transaction
        started = time.monotonic()
        with pytest.raises(LockTimeout, match=r"waited 2 s for the lock on table idem\.indicator") as raised:
            ingest(pg_url, feeds, spark, "feed-a", file, lock_timeout=2)
        assert time.monotonic() - started < 60
        assert isinstance(raised.value, TransientError)
        holder.rollback()
    with connect(pg_url) as conn:
        status, error = conn.execute("SELECT status, error FROM idem.ingest_ledger").fetchone() or (None, None)
        assert status == "failed" and error["class"] == "LockTimeout" and error["retryable"] is True
        assert conn.execute("SELECT count(*) FROM idem.indicator").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)
    assert ingest(pg_url, feeds, spark, "feed-a", file)["rows_written"] == 50


def test_a_column_is_added_in_short_tries_so_new_readers_wait_briefly(pg_url: str, feeds: IdemConfig, spark: Any) -> None:
    file = write_lines(drop_path(feeds, "feed-a", "wide.ndjson"), records("w", 20, brand_new="x"))
    waits: list[float] = []

    def late_reader() -> None:
        time.sleep(1.0)
        with connect(pg_url, autocommit=True) as conn:
            for _ in range(3):
                started = time.monotonic()
                conn.execute("SELECT count(*) FROM idem.indicator").fetchone()
                waits.append(time.monotonic() - started)

    with connect(pg_url) as long_report:
        long_report.execute("SELECT count(*) FROM idem.indicator").fetchone()  # holds ACCESS SHARE
        reader = threading.Thread(target=late_reader)

        def progress(line: str) -> None:
            if line.startswith("applying"):  # the progress line of the applying transaction
                reader.start()

        with pytest.raises(LockTimeout, match="to add column 'brand_new' to table idem.indicator"):
            ingest(pg_url, feeds, spark, "feed-a", file, progress=progress, lock_timeout=10)
        reader.join()
        long_report.rollback()
    # Each new reader waits for one try at most, far less than the 10 s the ALTER keeps trying.
    assert waits and max(waits) < ALTER_TRY_SECONDS + 2.5, waits
    assert ingest(pg_url, feeds, spark, "feed-a", file)["tables"]["indicator"]["new_columns"] == ["brand_new"]


def test_a_run_that_lost_its_claim_to_a_committed_run_replays(pg_url: str, feeds: IdemConfig, spark: Any) -> None:
    file = write_lines(drop_path(feeds, "feed-a", "lost.ndjson"), records("l", 30))
    other = str(uuid.uuid4())
    taken: list[bool] = []

    def progress(line: str) -> None:
        # While this run stages, "another run" (its locks were lost) takes the file
        # over and commits it.
        if line.startswith("slice ") and not taken:
            taken.append(True)
            with connect(pg_url) as conn:
                conn.execute(
                    "UPDATE idem.ingest_ledger SET status = 'committed', owner = 'other/' || %s, "
                    "result = %s WHERE namespace = 'feed-a'",
                    [other, psycopg.types.json.Jsonb({"commit_id": other, "rows_written": 30, "rows_skipped": 0, "rows_rejected": 0})],
                )

    summary = ingest(pg_url, feeds, spark, "feed-a", file, progress=progress)
    assert summary["replayed"] is True and summary["rows_written"] == 0
    assert summary["prior"]["commit_id"] == other
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.indicator").fetchone() == (0,)  # this run applied nothing
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)


def test_every_record_of_a_mixed_batch_is_counted(pg_url: str, feeds: IdemConfig, spark: Any) -> None:
    first = write_lines(drop_path(feeds, "feed-a", "first.ndjson"), records("m", 40) + ["", "not json"])
    done = ingest(pg_url, feeds, spark, "feed-a", first)
    assert (done["rows_written"], done["rows_skipped"], done["rows_rejected"]) == (40, 0, 1)
    second = write_lines(drop_path(feeds, "feed-a", "second.ndjson"), records("m", 10) + records("n", 5))
    mixed = ingest(pg_url, feeds, spark, "feed-a", first, second)
    # second: 5 new, 10 already in the table; first: its 41 records are replay skips.
    assert (mixed["rows_written"], mixed["rows_skipped"], mixed["rows_rejected"]) == (5, 10 + 41, 0)
    assert mixed["replay_skipped"] == 41 and mixed["already_committed"] == [str(first)]
    with connect(pg_url) as conn:
        events = dict(
            conn.execute(
                "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", [mixed["commit_id"]]
            ).fetchall()
        )
        skipped = conn.execute("SELECT rows_skipped FROM idem.commits WHERE commit_id = %s", [mixed["commit_id"]]).fetchone()
    assert events == {"written": 5, "idempotent_skip": 10, "replay_skip": 41}
    assert skipped == (51,)
    # What people read: the terminal summary and the Dagster materialization.
    from idem_platform.cli.output import human_summary
    from idem_platform.defs.summary import summary_metadata

    assert f"41 of the skipped are records of files committed before: {first}" in human_summary(mixed)
    assert summary_metadata(mixed)["replay_skipped"].value == 41


def test_a_replayed_file_counts_its_batch_s_totals_only_when_the_whole_batch_is_replayed(
    pg_url: str, feeds: IdemConfig, spark: Any
) -> None:
    """A ledger row keeps only its own file and how many keys its commit had: enough to tell
    a replay of the whole earlier batch (its exact counts) from a replay of part of it (each
    file's planned records)."""
    a = write_lines(drop_path(feeds, "feed-a", "pa.ndjson"), records("pa", 7) + ["not json"])
    b = write_lines(drop_path(feeds, "feed-a", "pb.ndjson"), records("pb", 5) + [""])
    together = ingest(pg_url, feeds, spark, "feed-a", a, b)
    assert (together["rows_written"], together["rows_rejected"]) == (12, 1)
    with connect(pg_url) as conn:
        result = conn.execute(
            "SELECT result FROM idem.ingest_ledger WHERE namespace = 'feed-a' AND key = %s",
            [together["files"][0]["key"]],
        ).fetchone()[0]
    assert len(result["files"]) == 1 and result["commit_keys"] == 2
    c = write_lines(drop_path(feeds, "feed-a", "pc.ndjson"), records("pc", 3))
    part = ingest(pg_url, feeds, spark, "feed-a", a, c)
    assert part["rows_written"] == 3 and part["replay_skipped"] == 8  # a's 8 planned lines, not the batch's 13
    d = write_lines(drop_path(feeds, "feed-a", "pd.ndjson"), records("pd", 2))
    whole = ingest(pg_url, feeds, spark, "feed-a", a, b, d)
    assert whole["rows_written"] == 2 and whole["replay_skipped"] == 13  # the batch's own counts, blank line excluded


def test_every_connection_has_tcp_keepalives(pg_url: str) -> None:
    with connect(pg_url) as conn:
        options = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    assert (options["keepalives"], options["keepalives_idle"], options["keepalives_count"]) == ("1", "30", "3")
    with connect(f"{pg_url}{'&' if '?' in pg_url else '?'}keepalives_idle=7") as conn:
        options = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    assert options["keepalives_idle"] == "7"  # the URL's own setting wins


def commit_once_blocked(url: str, other: psycopg.Connection, timeout: float = 120) -> None:
    """Commit ``other`` as soon as idem's applying connection waits for a lock."""
    deadline = time.monotonic() + timeout
    with connect(url, autocommit=True) as probe:
        while time.monotonic() < deadline:
            waiting = probe.execute(
                # this test's database only: another suite on the same server has idem-commits too
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-commit' "
                "AND wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
            if waiting and waiting[0]:
                break
            time.sleep(0.05)
    other.commit()


def test_a_key_another_writer_commits_meanwhile_is_skipped_not_duplicated(
    pg_url: str, feeds: IdemConfig, spark: Any
) -> None:
    from idem_platform.contract.canonical import canonical_bytes
    from idem_platform.contract.keys import record_key_of

    lines = records("c", 200)
    file = write_lines(drop_path(feeds, "feed-a", "contested.ndjson"), lines)
    contested = json.loads(lines[150])
    key = record_key_of("feed-a", "indicator", contested["id"], canonical_bytes(contested))
    with connect(pg_url) as other:  # another writer: the key inserted, its transaction still open
        other.execute(
            "INSERT INTO idem.indicator (_idempotency_key, _connector, _record_type, _external_id, _content_hash, "
            "_schema_version, _commit_id, _ingested_at, _payload, name) "
            "VALUES (%s, 'feed-b', 'indicator', %s, 'x', 1, %s, now(), '{}', 'theirs')",
            [key, contested["id"], str(uuid.uuid4())],
        )
        waiter = threading.Thread(target=commit_once_blocked, args=(pg_url, other))
        waiter.start()  # it commits once this run's insert waits on the key
        summary = ingest(pg_url, feeds, spark, "feed-a", file)
        waiter.join()
    assert (summary["rows_written"], summary["rows_skipped"]) == (199, 1)
    assert summary["timings"]["streaming_stopped"].startswith("UniqueViolation")
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT _idempotency_key) FROM idem.indicator").fetchone() == (200, 200)
        assert conn.execute("SELECT name FROM idem.indicator WHERE _idempotency_key = %s", [key]).fetchone() == ("theirs",)
