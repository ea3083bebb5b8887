"""The cost curve (issue 8): first ingest, replay and same-rows-new-file at 10k…5M records,
on local[2] and on a standalone cluster (a master and two workers on loopback).

    python benchmarks/cost_curve.py [--sizes 10000,100000,1000000,5000000] [--modes local,cluster]
                                    [--postgres postgresql://postgres@127.0.0.1:5432/postgres]

Cluster executors reach PostgreSQL over TCP, so both modes use the same TCP server
(default: the one on 127.0.0.1:5432), a fresh database per size and mode. Prints
rows/s and the peak resident memory of the driver (the Python process) and of the
Spark driver JVM for every run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    CONFIG,
    Phase,
    copy_of,
    data_file,
    environment,
    fresh_database,
    run_ingest,
)


def config_for(directory: Path, master: str, conf: dict[str, str]) -> Path:
    data = yaml.safe_load(CONFIG)
    data["spark"] = {"master": master, "conf": {**data["spark"]["conf"], **conf}}
    path = directory / f"idem-{master.split(':')[0].replace('[', '').replace(']', '')}.yaml"
    path.write_text(yaml.safe_dump(data))
    (directory / "drop").mkdir(exist_ok=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000,5000000")
    parser.add_argument("--modes", default="local,cluster")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data"))
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")

    cluster = None
    results: list[tuple[str, int, Phase]] = []
    try:
        for mode in modes:
            if mode == "cluster":
                from idem_platform_tests.helpers.spark_cluster import (
                    FAST_FAILURE_DAEMON_CONF,
                    start_spark_cluster,
                )

                cluster = start_spark_cluster(
                    Path(tempfile.mkdtemp(prefix="idem-curve-")), workers=2, cores_per_worker=1, memory="2g",
                    daemon_conf=FAST_FAILURE_DAEMON_CONF,
                )
                conf = {k: v for k, v in cluster.session_conf().items() if k != "spark.master"}
                conf["spark.executor.memory"] = "1g"
                config = config_for(workdir, cluster.master_url, conf)
            else:
                config = config_for(workdir, "local[2]", {})
            for size in sizes:
                feed = data_file(workdir, size)
                url = fresh_database(args.postgres, f"idem_curve_{mode}_{size}")
                env = environment(url, workdir / f"dagster_home_{mode}", "local[2]")
                env.pop("IDEM_SPARK_MASTER")
                for name, path in (
                    ("first ingest", feed),
                    ("replay", feed),
                    ("same rows, new file", copy_of(feed, workdir / f"copy-{size}.ndjson")),
                ):
                    phase = run_ingest(name, path, size, env, config)
                    results.append((mode, size, phase))
                    print(
                        f"{mode:8} {size:>9,} {name:22} {phase.wall:8.2f} s {phase.rows_per_second:9,.0f} rows/s "
                        f"driver {phase.driver_peak_mib:5.0f} MiB  JVM {phase.jvm_peak_mib:5.0f} MiB",
                        flush=True,
                    )
    finally:
        if cluster is not None:
            cluster.stop()

    print()
    print(f"{'mode':8} {'records':>9} {'phase':22} {'seconds':>8} {'rows/s':>9} {'driver MiB':>10} {'JVM MiB':>8}")
    for mode, size, phase in results:
        print(
            f"{mode:8} {size:>9,} {phase.name:22} {phase.wall:8.2f} {phase.rows_per_second:9,.0f} "
            f"{phase.driver_peak_mib:10.0f} {phase.jvm_peak_mib:8.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
