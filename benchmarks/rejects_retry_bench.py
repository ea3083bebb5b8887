"""The quarantine loop's benchmark (issue 15): a feed with 5 % bad rows, the fix, the retry.

    python benchmarks/rejects_retry_bench.py [--records 100000] [--postgres URL] [--master local[2]]

1. ``idem ingest`` of ``--records`` seeded threat-feed lines (no duplicates), every
   20th one bad: half miss their required ``name``, half are of a record type
   (``campaign``) the catalog does not have: 95 % commit, 5 % are quarantined;
2. the catalog is fixed in idem.yaml (``name`` no longer required, a ``campaign`` table);
3. ``idem rejects retry --dry-run`` (counts in Spark, commits nothing);
4. ``idem rejects retry``: the 5 % commit, once;
5. ``idem rejects retry`` again: nothing to retry, nothing written.

Every phase is the real CLI in a child process (interpreter, Dagster, a cold Spark
session and the commit included), as in ``ingest_bench.py``. Default PostgreSQL
is the embedded one; ``--postgres`` takes a server URL (a fresh database is made).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import CONFIG, embedded_server, environment, fresh_database, run_idem  # noqa: E402
from idem_platform.samples import threatfeed_lines, write_lines  # noqa: E402

STRICT = CONFIG
FIXED = CONFIG.replace("{type: string, required: true}", "string").replace(
    "spark:", "  campaign:\n    columns:\n      name: string\n      budget: long\nspark:"
)
BAD_EVERY = 20  # 5 %


def bad_feed(path: Path, records: int, *, seed: int = 42) -> int:
    """Write the feed (generated once, reused); return how many lines are bad."""
    bad = -(-records // BAD_EVERY)
    if path.exists():
        return bad
    lines = []
    for index, line in enumerate(threatfeed_lines(records, seed=seed, duplicate_ratio=0.0)):
        if index % BAD_EVERY == 0:
            record = json.loads(line)
            if (index // BAD_EVERY) % 2:
                del record["name"]  # a required field missing
            else:
                record["type"] = "campaign"  # a record type the catalog lacks
            line = json.dumps(record, ensure_ascii=False)
        lines.append(line)
    write_lines(path, lines)
    return bad


def run_cli(name: str, args: list[str], env: dict[str, str], config: Path) -> tuple[float, dict[str, Any], float, float]:
    """Run ``idem ARGS --config CONFIG`` as a child process; return wall seconds, its JSON summary, peak MiB."""
    return run_idem(name, [*args, "--config", str(config)], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--postgres", help="server URL (default: the embedded pgserver)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data" / "retry"))
    args = parser.parse_args()

    workdir = Path(args.workdir).resolve()
    (workdir / "drop").mkdir(parents=True, exist_ok=True)
    server = args.postgres or embedded_server(workdir / ".idem")
    config = workdir / "idem.yaml"
    config.write_text(STRICT)
    feed = workdir / "drop" / f"feed-{args.records}-bad5.ndjson"
    bad = bad_feed(feed, args.records)
    url = fresh_database(server, "idem_bench_retry")
    env = environment(url, workdir / "dagster_home", args.master)

    phases: list[tuple[str, float, dict[str, Any], float, float]] = []
    phases.append(("ingest (strict catalog)", *run_cli("ingest", ["ingest", "--connector", "threatfeed", str(feed)], env, config)))
    config.write_text(FIXED)
    for name, extra in (
        ("retry --dry-run", ["--dry-run"]),
        ("retry", []),
        ("retry again", []),
    ):
        phases.append((name, *run_cli(name, ["rejects", "retry", "--connector", "threatfeed", *extra], env, config)))

    first, dry, retried, again = (p[2] for p in phases)
    checks = {
        "ingest quarantines the bad 5 %": first["rows_rejected"] == bad and first["rows_written"] == args.records - bad,
        "dry run: all would pass, nothing committed": dry["retry"].get("would_pass") == bad and dry["commit_id"] is None,
        "retry commits them once": retried["rows_written"] == bad and retried["retry"]["still_failing"] == 0,
        "second retry writes nothing": again["commit_id"] is None and again.get("nothing_to_retry") is True,
    }
    print(
        f"records: {args.records:,}  bad: {bad:,} ({bad / args.records:.0%})  master: {args.master}  "
        f"postgres: {'server' if args.postgres else 'embedded'}"
    )
    print(f"{'phase':24} {'seconds':>8} {'in run':>7} {'driver MiB':>10} {'JVM MiB':>8}  written/skipped/rejected  retry")
    for name, wall, summary, driver, jvm in phases:
        retry = summary.get("retry") or {}
        detail = ", ".join(
            f"{k} {retry[k]:,}" for k in ("selected", "passed", "still_failing", "would_pass", "would_fail") if retry.get(k) is not None
        )
        if summary.get("nothing_to_retry"):
            detail = f"nothing to retry: {retry.get('message')}"
        print(
            f"{name:24} {wall:8.2f} {float(summary.get('seconds') or 0):7.2f} {driver:10.0f} {jvm:8.0f}  "
            f"{summary['rows_written']:,}/{summary['rows_skipped']:,}/{summary['rows_rejected']:,}  {detail}"
        )
    timings = retried.get("timings") or {}
    if timings:
        print("retry commit timings: " + json.dumps({k: v for k, v in timings.items() if not isinstance(v, list)}))
    for check, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {check}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
