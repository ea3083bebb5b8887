"""Per-record CPU cost of ``coerce_batch`` in process, on its three paths.

    python benchmarks/coerce_bench.py [--records 200000] [--batch 10000] [--runs 7] [--gc-paused] [--json]

The threat-feed lines of ``idem_platform.samples`` (10% exact repeats), in batches shaped
like the file-drop reader's, coerced with the commit path's spec (Spark types, ``dynamic``
values left to PostgreSQL) and one ``RepeatedLines`` per run, as ``stage_slice`` does:

* ``direct``: the C path writing direct rows (``DirectRows``);
* ``arrow``: the C path, Arrow batch only;
* ``python``: ``IDEM_NATIVE=0``.

Runs alternate between the paths (the machine is shared and noisy); each run's CPU time
(``time.process_time``) per record is reported as the min and median over runs.
``--gc-paused`` switches the cyclic garbage collector off around each batch, to measure
what pausing it would buy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from benchmarks.harness import CONFIG  # noqa: E402
from idem_platform.coercion.records import DirectRows, RecordSpec, RepeatedLines, coerce_batch  # noqa: E402
from idem_platform.config import parse_config  # noqa: E402
from idem_platform.samples import threatfeed_lines  # noqa: E402
from idem_platform_tests.helpers.batches import lines_batch  # noqa: E402

PATHS = ("direct", "arrow", "python")


def commit_spec() -> RecordSpec:
    """The spec the commit path coerces the benchmark's threat feed with."""
    from idem_platform.pipeline.ingest import record_spec

    config = parse_config(CONFIG)
    connector = config.connector("threatfeed")
    spec = record_spec(connector, config.tables_for(connector), [])
    # One synthetic unit: units only give the rows' position prefixes.
    return replace(spec, units=(("feed.ndjson#L", 0),), dynamic_values=False)


def batches(records: int, size: int) -> list[pa.RecordBatch]:
    """The seeded threat-feed lines as reader batches of ``size`` lines."""
    lines = [line.encode() + b"\n" for line in threatfeed_lines(records, seed=7)]
    return [lines_batch(lines[at : at + size], first_line=at + 1) for at in range(0, len(lines), size)]


def run(path: str, spec: RecordSpec, chunks: list[pa.RecordBatch], *, gc_paused: bool) -> float:
    """One pass over every batch on ``path``: CPU seconds."""
    os.environ["IDEM_NATIVE"] = "0" if path == "python" else "1"
    repeats = RepeatedLines()
    gc.collect()
    started = time.process_time()
    for chunk in chunks:
        direct = DirectRows(list(spec.tables)) if path == "direct" else None
        if gc_paused:
            gc.disable()
        try:
            coerce_batch(chunk, spec, repeats, direct)
        finally:
            if gc_paused:
                gc.enable()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--gc-paused", action="store_true")
    parser.add_argument("--json", action="store_true", help="print every run's µs/record as JSON instead")
    args = parser.parse_args()
    spec = commit_spec()
    chunks = batches(args.records, args.batch)
    paths = args.paths.split(",")
    seconds: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(args.runs):
        for path in paths:
            seconds[path].append(run(path, spec, chunks, gc_paused=args.gc_paused))
    if args.json:
        print(json.dumps({path: [s / args.records * 1e6 for s in runs] for path, runs in seconds.items()}))
        return 0
    for path in paths:
        per = [s / args.records * 1e6 for s in seconds[path]]
        print(f"{path:7s} µs/record  min {min(per):6.2f}  median {statistics.median(per):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
