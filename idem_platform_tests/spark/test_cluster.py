"""The same ingest on a real standalone Spark cluster (a master and two workers on loopback):
same keys and counts as local[2]; exactly once when a worker dies mid-write and
when speculation runs a second copy of a slow task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform.coercion.records import coerce_batch
from idem_platform.config import IdemConfig, load_config
from idem_platform.contract.catalog import table_name
from idem_platform.pipeline.ingest import prepare_tables, record_spec
from idem_platform.postgres import connect
from idem_platform.postgres.connection import is_unix_socket_url
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.kafka.offsets import committed_offsets
from idem_platform.write.batch import Unit
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.faults import wait_until_staging
from idem_platform_tests.helpers.ingest import ingest as ingest_in_process
from idem_platform_tests.helpers.kafka import expected_outcome, kafka_config
from idem_platform_tests.helpers.kafka_broker import Broker, create_topic, produce, spread
from idem_platform_tests.helpers.spark_cluster import (
    FAST_FAILURE_DAEMON_CONF,
    SparkCluster,
    start_spark_cluster,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TABLES = ("indicator", "malware", "threat-actor")


@pytest.fixture
def tcp_pg(pg_url: str) -> str:
    if is_unix_socket_url(pg_url):
        reason = "cluster executors need PostgreSQL over TCP (set IDEM_TEST_POSTGRES_URL)"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"CI must run the cluster tests: {reason}")  # never a silent skip in CI
        pytest.skip(reason)
    reset_database(pg_url)
    return pg_url


def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    cluster = start_spark_cluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores_per_worker=1, memory="1g",
        daemon_conf=FAST_FAILURE_DAEMON_CONF,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    yield from _cluster(tmp_path_factory)


@pytest.fixture
def doomed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A cluster of its own for the test that kills one of its workers."""
    yield from _cluster(tmp_path_factory)


def write_config(directory: Path, master: str, conf: dict[str, str]) -> Path:
    data = yaml.safe_load(example_text())
    data["connectors"][0]["path"] = str(directory / "drop")
    data["connectors"][0]["split_bytes"] = 4 << 20  # several slices (tasks) even for a 10 MB file
    data["spark"] = {"master": master, "conf": conf}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "idem.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def ingest(config: Path, file: Path, pg_url: str, home: Path, **extra_env: str) -> subprocess.Popen[str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ, "IDEM_POSTGRES_URL": pg_url, "DAGSTER_HOME": str(home), "PYSPARK_PYTHON": sys.executable, **extra_env,
    }
    for name in ("IDEM_SPARK_MASTER", "IDEM_FAULT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "idem_platform.cli", "ingest", "--config", str(config), "--connector", "threatfeed", str(file)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], timeout: float = 600) -> tuple[int, dict[str, Any] | None, str]:
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return process.returncode, (json.loads(lines[-1]) if lines else None), err


def stored_keys(pg_url: str) -> set[str]:
    with connect(pg_url) as conn:
        return {
            row[0]
            for table in TABLES
            for row in conn.execute(f'SELECT _idempotency_key FROM idem.{table_name(table)}').fetchall()
        }


def expected_keys(config: IdemConfig, lines: list[str], sha256: str) -> set[str]:
    """The keys the coercion gives these lines (computed here, without Spark)."""
    connector = config.connector("threatfeed")
    unit = Unit(id="f", key=f"filedrop:{sha256}", request={}, position_prefix=f"{sha256[:16]}#L", label="f", records=0, source={})
    spec = record_spec(connector, config.tables_for(connector), [unit])
    batch = lines_batch([line.encode() for line in lines])
    return {k for k in coerce_batch(batch, spec).column("_idempotency_key").to_pylist() if k}


def assert_exactly_once(pg_url: str, summary: dict[str, Any], lines: list[str], keys: set[str]) -> None:
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == len(lines)
    assert stored_keys(pg_url) == keys
    assert summary["rows_written"] == len(keys)
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits WHERE NOT replay").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM idem.rejects").fetchone() == (summary["rows_rejected"],)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)


def test_cluster_gives_the_same_keys_and_counts_as_local(cluster: SparkCluster, tcp_pg: str, tmp_path: Path, spark: Any) -> None:
    lines = list(threatfeed_lines(30_000, seed=21, duplicate_ratio=0.1, bad_ratio=0.01))
    file = write_lines(tmp_path / "drop" / "feed.ndjson", lines)
    # The local reference on the session's own local[2] Spark, in process (no second `idem
    # ingest` to start): the same config but for its master, the same write path.
    local = load_config(write_config(tmp_path / "local", "local[2]", {"spark.ui.enabled": "false"}))
    prepare_tables(tcp_pg, local, local.connector("threatfeed"))
    local_summary = ingest_in_process(tcp_pg, local, spark, file)
    local_keys = stored_keys(tcp_pg)

    reset_database(tcp_pg)
    remote = write_config(tmp_path / "remote", cluster.master_url, cluster.session_conf())
    code, remote_summary, err = finish(ingest(remote, file, tcp_pg, tmp_path / "home-remote"))
    assert code == 0, err[-3000:]
    assert remote_summary is not None
    for key in ("rows_written", "rows_skipped", "rows_rejected", "tables"):
        assert remote_summary[key] == local_summary[key], key
    assert stored_keys(tcp_pg) == local_keys
    assert len(remote_summary["timings"]["stage_task_seconds"]) > 1  # several tasks, on the workers


def test_embedded_postgres_with_a_cluster_master_fails_at_start(cluster: SparkCluster, tmp_path: Path) -> None:
    file = write_lines(tmp_path / "drop" / "f.ndjson", ['{"type":"malware","id":1,"name":"x"}'])
    config = write_config(tmp_path, cluster.master_url, cluster.session_conf())
    env = {**os.environ, "IDEM_HOME": str(tmp_path / ".idem"), "DAGSTER_HOME": str(tmp_path / "home")}
    env.pop("IDEM_POSTGRES_URL", None)
    (tmp_path / "home").mkdir()
    completed = subprocess.run(
        [sys.executable, "-m", "idem_platform.cli", "ingest", "--config", str(config), "--connector", "threatfeed", str(file)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    try:
        assert completed.returncode == 1
        assert "Set IDEM_POSTGRES_URL to a TCP URL every executor can reach" in completed.stderr
    finally:
        pid_file = tmp_path / ".idem" / "pg" / "postmaster.pid"
        if pid_file.exists():
            subprocess.run(["kill", pid_file.read_text().split()[0]], check=False)


def feed(config: IdemConfig, path: Path, count: int, seed: int) -> tuple[list[str], Path, set[str]]:
    """A generated feed written to ``path``, with the keys its good records must get."""
    lines = list(threatfeed_lines(count, seed=seed, duplicate_ratio=0.1, bad_ratio=0.01))
    file = write_lines(path, lines)
    return lines, file, expected_keys(config, lines, hash_file(file).sha256)


def test_a_worker_killed_mid_write_still_commits_every_record_once(
    doomed_cluster: SparkCluster, tcp_pg: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    lines, file, keys = feed(threatfeed, tmp_path / "drop" / "big.ndjson", 120_000, seed=22)
    config = write_config(tmp_path, doomed_cluster.master_url, doomed_cluster.session_conf())
    process = ingest(config, file, tcp_pg, tmp_path / "home")
    staged = wait_until_staging(tcp_pg, process)
    killed = doomed_cluster.kill_worker(1)
    assert killed
    code, summary, err = finish(process)
    outcome = "completed on the surviving worker"
    if code != 0:  # the job may fail instead of completing: then a rerun commits everything once
        assert stored_keys(tcp_pg) == set(), "a failed run must leave nothing visible"
        outcome = f"failed ({err.strip().splitlines()[-1][:200]}), rerun committed"
        code, summary, err = finish(ingest(config, file, tcp_pg, tmp_path / "home"))
    assert code == 0 and summary is not None, err[-3000:]
    assert_exactly_once(tcp_pg, summary, lines, keys)
    retried = [i for i, n in enumerate(summary["timings"]["stage_attempt_numbers"]) if n > 0]
    print(f"\nworker killed after {staged} rows were staged: {outcome}; splits retried: {retried}")


def test_speculative_copies_of_a_slow_task_are_not_rows(
    cluster: SparkCluster, tcp_pg: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    lines, file, keys = feed(threatfeed, tmp_path / "drop" / "slow.ndjson", 12_000, seed=23)
    conf = {
        **cluster.session_conf(),
        "spark.speculation": "true",
        "spark.speculation.interval": "200ms",
        # Each split is its own one-task stage: speculate on duration alone.
        "spark.speculation.task.duration.threshold": "3s",
        # The first attempt of split 0 stages its first batch, then stalls.
        "spark.executorEnv.IDEM_FAULT": "staging:sleep:60:split=0,attempt=0",
    }
    config = write_config(tmp_path, cluster.master_url, conf)
    code, summary, err = finish(ingest(config, file, tcp_pg, tmp_path / "home"))
    assert code == 0 and summary is not None, err[-3000:]
    assert summary["timings"]["stage_attempt_numbers"][0] == 1, "the speculative copy should have won split 0"
    assert_exactly_once(tcp_pg, summary, lines, keys)


DAGSTER_RUN = """
import json, sys
import dagster as dg
from pyspark.sql import SparkSession
from idem_platform.config import load_config
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.definitions import defs

spark_config, path = json.loads(sys.argv[1]), sys.argv[2]
connector = load_config().connector("threatfeed")
key = partition_key_for(connector, path)
with dg.instance_for_test() as instance:
    instance.add_dynamic_partitions(partitions_for(connector).name, [key])
    result = defs().resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance,
        partition_key=key,
        run_config={
            "ops": {"threatfeed__ingest": {"config": {"files": [path]}}},
            # What a user types in the Launchpad: the spark resource's own config.
            "resources": {"idem_spark": {"config": {"spark_config": spark_config}}},
        },
    )
    (event,) = [m for m in result.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    metadata = {k: v.value for k, v in event.metadata.items()}
print(json.dumps({"master": SparkSession.getActiveSession().sparkContext.master,
                  "rows_written": metadata["rows_written"], "rows_rejected": metadata["rows_rejected"]}))
"""


def test_the_dagster_spark_resource_config_alone_sends_the_run_to_the_cluster(
    cluster: SparkCluster, tcp_pg: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    lines, file, keys = feed(threatfeed, tmp_path / "drop" / "dagster.ndjson", 6_000, seed=24)
    config = write_config(tmp_path, "local[2]", {"spark.ui.enabled": "false"})  # idem.yaml says local
    spark_config = {"spark.master": cluster.master_url, **cluster.session_conf()}
    env = {**os.environ, "IDEM_CONFIG": str(config), "IDEM_POSTGRES_URL": tcp_pg, "PYSPARK_PYTHON": sys.executable}
    for name in ("IDEM_SPARK_MASTER", "IDEM_FAULT", "DAGSTER_HOME"):
        env.pop(name, None)
    completed = subprocess.run(
        [sys.executable, "-c", DAGSTER_RUN, json.dumps(spark_config), str(file)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["master"] == cluster.master_url
    assert stored_keys(tcp_pg) == keys
    assert report["rows_written"] == len(keys)


@pytest.mark.kafka
def test_kafka_ranges_are_read_and_committed_on_the_cluster(
    cluster: SparkCluster, tcp_pg: str, tmp_path: Path, kafka_broker: Broker, topic: str
) -> None:
    """Each task on a worker assigns itself its partition's offsets: same keys, offsets moved once."""
    create_topic(kafka_broker.bootstrap, topic, 3)
    messages = spread(threatfeed_lines(20_000, seed=25, duplicate_ratio=0.1, bad_ratio=0.01), 3)
    produce(kafka_broker.bootstrap, topic, messages)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=tcp_pg)
    assert config.source is not None
    data = yaml.safe_load(config.source.read_text())
    data["spark"] = {"master": cluster.master_url, "conf": cluster.session_conf()}
    config.source.write_text(yaml.safe_dump(data))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "IDEM_POSTGRES_URL": tcp_pg, "DAGSTER_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    for name in ("IDEM_SPARK_MASTER", "IDEM_FAULT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "idem_platform.cli", "ingest", "--config", str(config.source), "--connector", "events"]
    code, summary, err = finish(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    assert code == 0 and summary is not None, err[-3000:]
    keys, rejected = expected_outcome(config, messages, topic)
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == 20_000
    assert summary["rows_rejected"] == rejected and stored_keys(tcp_pg) == keys
    assert len(summary["timings"]["stage_task_seconds"]) == 3  # one task per partition range, on the workers
    with connect(tcp_pg) as conn:
        assert committed_offsets(conn, "events") == {(topic, p): sum(1 for m in messages if m[0] == p) for p in range(3)}
