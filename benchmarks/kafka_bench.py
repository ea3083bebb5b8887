"""The Kafka path end to end (issue 12), beside the file path on the same records.

    python benchmarks/kafka_bench.py [--records 200000] [--partitions 3] [--modes local,cluster]
                                     [--repeat 3] [--postgres URL] [--bootstrap HOST:PORT]

One seeded feed (the file benchmark's generator, 10 % duplicates) is produced once to
a topic (one message per record batch: the test broker's watermarks are exact only
then, see STACK.md) and written once as a file. Then, per mode and round, each on a
fresh database:

* ``kafka``: ``idem ingest --connector stream`` as a child process (interpreter,
  Dagster, a cold Spark session, reading every partition from offset 0, the commit);
* ``file``: ``idem ingest --connector drops FILE``, the same records from a file;
* ``broker floor``: one plain consumer per partition, in parallel, reading the same
  offsets with no idem at all: how fast the broker itself hands the messages out.

Without ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``) the in-memory test broker
(Tansu) is started. Both modes use the TCP server (cluster executors must reach it).
Prints the median of the rounds: seconds, messages/s, and the Kafka/file ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks.harness import CONFIG, Phase, data_file, environment, fresh_database, run_ingest  # noqa: E402


def write_config(directory: Path, bootstrap: str, topic: str, master: str, conf: dict[str, str]) -> Path:
    data = yaml.safe_load(CONFIG)
    data["connectors"] = [
        {**data["connectors"][0], "name": "drops"},
        {
            "name": "stream", "kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic],
            "record_type_field": "type", "id_field": "id",
        },
    ]
    data["spark"] = {"master": master, "conf": {**data["spark"]["conf"], **conf}}
    path = directory / f"idem-kafka-{'cluster' if master.startswith('spark:') else 'local'}.yaml"
    path.write_text(yaml.safe_dump(data))
    (directory / "drop").mkdir(exist_ok=True)
    return path


def produce_feed(bootstrap: str, topic: str, partitions: int, feed: Path) -> int:
    from idem_platform_tests.helpers.kafka_broker import create_topic, produce

    create_topic(bootstrap, topic, partitions)
    with feed.open("rb") as handle:
        lines = [line.rstrip(b"\n") for line in handle]
    return produce(bootstrap, topic, ((i % partitions, None, line, None) for i, line in enumerate(lines)))


def broker_floor(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    """Seconds for one plain consumer per partition, in parallel, to read every message."""
    from confluent_kafka import Consumer, TopicPartition

    def read(partition: int, counts: list[int]) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "idem-bench-floor",
                             "enable.partition.eof": True, "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, partition, 0)])
        while True:
            messages = consumer.consume(num_messages=10_000, timeout=1.0)
            if any(m.error() is not None for m in messages):
                counts[partition] += sum(1 for m in messages if m.error() is None)
                break
            counts[partition] += len(messages)
        consumer.close()

    counts = [0] * partitions
    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(p, counts)) for p in range(partitions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    assert sum(counts) == records, f"the floor read {sum(counts)} of {records} messages"
    return seconds


def median_phase(phases: list[Phase]) -> Phase:
    return sorted(phases, key=lambda p: p.wall)[(len(phases) - 1) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--modes", default="local,cluster")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data"))
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    feed = data_file(workdir, args.records)

    from idem_platform_tests.helpers.kafka_broker import Broker

    broker = Broker(bootstrap=args.bootstrap) if args.bootstrap else Broker.start_tansu()
    cluster = None
    topic = f"idem-bench-{int(time.time())}"
    try:
        started = time.monotonic()
        produced = produce_feed(broker.bootstrap, topic, args.partitions, feed)
        print(f"produced {produced:,} messages to {topic} ({args.partitions} partitions) in "
              f"{time.monotonic() - started:.1f}s (not timed)", flush=True)
        floors = [broker_floor(broker.bootstrap, topic, args.partitions, produced) for _ in range(args.repeat)]
        results: dict[str, dict[str, Phase]] = {}
        for mode in args.modes.split(","):
            if mode == "cluster":
                from idem_platform_tests.helpers.spark_cluster import (
                    FAST_FAILURE_DAEMON_CONF,
                    start_spark_cluster,
                )

                cluster = start_spark_cluster(
                    Path(tempfile.mkdtemp(prefix="idem-kafka-bench-")), workers=2, cores_per_worker=1,
                    memory="2g", daemon_conf=FAST_FAILURE_DAEMON_CONF,
                )
                conf = {k: v for k, v in cluster.session_conf().items() if k != "spark.master"}
                conf["spark.executor.memory"] = "1g"
                config = write_config(workdir, broker.bootstrap, topic, cluster.master_url, conf)
            else:
                config = write_config(workdir, broker.bootstrap, topic, "local[2]", {})
            kafka_runs, file_runs = [], []
            for round_ in range(args.repeat):
                for kind, runs in (("kafka", kafka_runs), ("file", file_runs)):
                    url = fresh_database(args.postgres, f"idem_kafka_bench_{mode}_{kind}")
                    env = environment(url, workdir / f"dagster_home_kafka_{mode}", "local[2]")
                    env.pop("IDEM_SPARK_MASTER")
                    if kind == "kafka":
                        phase = run_ingest(f"{mode} kafka", None, produced, env, config, connector="stream")
                    else:
                        phase = run_ingest(f"{mode} file", feed, produced, env, config, connector="drops")
                    runs.append(phase)
                    s = phase.summary
                    print(f"  {mode} round {round_ + 1} {kind:5}: {phase.wall:6.2f}s "
                          f"({s['rows_written']}/{s['rows_skipped']}/{s['rows_rejected']}; inside the run {s.get('seconds')}s)",
                          flush=True)
            results[mode] = {"kafka": median_phase(kafka_runs), "file": median_phase(file_runs)}
            if cluster is not None:
                cluster.stop()
                cluster = None
        floor = statistics.median(floors)
        print(f"\nrecords: {produced:,}  partitions: {args.partitions}  rounds: {args.repeat} (median shown)")
        print(f"{'mode':8} {'path':6} {'seconds':>8} {'inside':>7} {'msgs/s':>9} {'kafka/file':>10}")
        for mode, pair in results.items():
            for kind in ("kafka", "file"):
                phase = pair[kind]
                ratio = pair["kafka"].rows_per_second / pair["file"].rows_per_second
                print(f"{mode:8} {kind:6} {phase.wall:8.2f} {float(phase.summary.get('seconds') or 0):7.2f} "
                      f"{phase.rows_per_second:9,.0f} {ratio if kind == 'kafka' else 1.0:10.2f}")
        print(f"broker floor (plain consumers, one per partition, no idem): {floor:.2f}s = {produced / floor:,.0f} msgs/s")
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
