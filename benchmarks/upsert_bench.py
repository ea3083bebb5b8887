"""Upsert tables: idem beside a hand-written upsert and dlt's ``upsert`` merge, one server, one run.

    python benchmarks/upsert_bench.py [--rounds 3] [--records 1000000] [--delta-base 10000000]
                                      [--shared DIR] [--postgres URL] [--out results.json]

The data (seeded, written once under ``--workdir``): ``--records`` change events over
``records / 10`` identities in 10 NDJSON files. Each event is ``{id, version, op, ...}``
with a few typed fields (``name``, ``amount``, ``qty``, ``ts``); ``version`` increases per
id; 5 % of the events are deletes (``op: "d"``, id and version only); 10 % of the lines are
exact duplicates of an earlier line (same file or later); a tenth of the events are
delivered out of order (moved to a later file than their place, behind newer versions).

Contenders, each into a fresh database, in a rotating order per round:

* **idem**: ``idem ingest`` of the 10 files as a child process into a table with
  ``mode: upsert``, ``order_by: version``, ``delete_when: {field: op, equals: d}``, on the
  Spark Connect server started before the rounds (as ``shared_bench.py`` does);
* **hand**: per file, COPY (psycopg, parsed in Python) into a temporary staging table, then
  ``INSERT … SELECT DISTINCT ON (id) … ORDER BY id, version DESC ON CONFLICT (id) DO UPDATE
  … WHERE excluded.version > t.version``, deletes kept as a tombstone flag, one transaction
  per file: order-safe like idem;
* **dlt**: ``benchmarks/upsert_dlt_peer.py`` in the peers' venv (made as the shared
  benchmark's ``run.sh`` makes it), one pipeline run per file, merge ``upsert``.

Every contender's final current state is compared with the fold of the events (per id the
greatest version; none if it is a delete): idem and hand must equal it (else exit 1); dlt
is last write wins by load order, so the identities where it differs are counted, not failed.

The daily-delta case: a current table of ``--delta-base`` identities loaded once, outside
the timing, by each contender's fast path (idem: one ``idem ingest`` of one big file;
hand: the same staging path, one file; dlt: one ``replace`` run), then one file of 5 % as
many events (updates, deletes, duplicates and stale versions alike) applied and timed.

The fixed cost: one 1-line file into a fresh database, per contender, reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
import psycopg  # noqa: E402
import yaml  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    SetupError,
    begin_run,
    checkpoint,
    environment,
    fresh_database,
    masked_url,
    peer_bench_home,
    quiet_server,
    run_idem,
    server_record,
    spark_on_bench_server,
    start_spark_server_for,
)
from benchmarks.shared_bench import peer_python  # noqa: E402
from benchmarks.small_bench import drop_database  # noqa: E402

HERE = Path(__file__).resolve().parent
SEED = 36
TOOLS = ("idem", "hand", "dlt")
FIELDS = ("name", "amount", "qty", "ts")


@dataclass
class Result:
    """One timed run of one contender."""

    tool: str
    phase: str
    round: int
    wall: float
    records: int
    details: dict[str, Any] = field(default_factory=dict)


# --- data -------------------------------------------------------------------------------


def _event(rng: random.Random, ident: int, version: int) -> dict[str, Any]:
    """One change event: 5 % deletes (identity and order only), else an update with typed fields."""
    key = f"e{ident:08d}"
    if rng.random() < 0.05:
        return {"id": key, "version": version, "op": "d"}
    return {
        "id": key, "version": version, "op": "u", "name": f"name-{ident}-{version}", "amount": round(rng.uniform(0, 1e4), 2),
        "qty": rng.randint(0, 1000), "ts": f"2026-{1 + version % 12:02d}-{1 + ident % 28:02d}T{version % 24:02d}:00:00Z",
    }


def write_events(directory: Path, records: int, files: int, seed: int = SEED) -> list[Path]:
    """``records`` lines in ``files`` NDJSON files (see the module doc), written once per (records, files, seed)."""
    target = directory / f"events-n{records}-f{files}-s{seed}"
    paths = [target / f"part-{i:02d}.ndjson" for i in range(files)]
    if (target / "done").exists():
        return paths
    target.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    identities = max(1, records // 10)
    unique = records - records // 10
    versions = [0] * identities
    lines: list[bytes] = []
    for _ in range(unique):
        ident = rng.randrange(identities)
        versions[ident] += 1
        lines.append(orjson.dumps(_event(rng, ident, versions[ident])))
    per = -(-unique // files)
    buckets: list[list[bytes]] = [lines[i * per : (i + 1) * per] for i in range(files)]
    for index in range(files - 1):  # a tenth of the events delivered late: moved to a later file
        bucket, late = buckets[index], []
        for position in sorted(rng.sample(range(len(bucket)), len(bucket) // 10), reverse=True):
            late.append(bucket.pop(position))
        for line in late:
            buckets[rng.randrange(index + 1, files)].append(line)
    for _ in range(records - unique):  # exact duplicate lines, in the same file or a later one
        source = rng.randrange(files)
        if buckets[source]:
            buckets[rng.randrange(source, files)].append(rng.choice(buckets[source]))
    for path, bucket in zip(paths, buckets, strict=True):
        rng.shuffle(bucket)
        path.write_bytes(b"\n".join(bucket) + b"\n")
    (target / "done").write_text("ok", encoding="utf-8")
    return paths


def write_delta(directory: Path, base: int, seed: int = SEED) -> tuple[Path, Path]:
    """The daily-delta case: ``base`` identities at version 1 (one file), then 5 % as many events over them
    and some new ones (updates, 5 % deletes, 10 % duplicates, a tenth stale: older than the base), one file."""
    target = directory / f"delta-b{base}-s{seed}"
    base_path, delta_path = target / "base.ndjson", target / "delta.ndjson"
    if (target / "done").exists():
        return base_path, delta_path
    target.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    with base_path.open("wb") as out:
        for start in range(0, base, 100_000):
            out.write(b"".join(orjson.dumps(_base_event(rng, i)) + b"\n" for i in range(start, min(base, start + 100_000))))
    count = base // 20
    lines = []
    latest: dict[int, int] = {}  # per id, the last version given out (each version once per id)
    for _ in range(count - count // 10):
        ident = rng.randrange(int(base * 1.02))  # 2 % of the ids are new identities
        if ident < base and ident not in latest and rng.random() < 0.1:
            version = 0  # stale: older than the base row
            latest[ident] = 1
        else:
            version = latest[ident] = latest.get(ident, 1) + 1
        lines.append(orjson.dumps(_event(rng, ident, version)))
    lines += [rng.choice(lines) for _ in range(count // 10)]
    rng.shuffle(lines)
    delta_path.write_bytes(b"\n".join(lines) + b"\n")
    (target / "done").write_text("ok", encoding="utf-8")
    return base_path, delta_path


def _base_event(rng: random.Random, ident: int) -> dict[str, Any]:
    """A base table row: version 1, never a delete."""
    return {
        "id": f"e{ident:08d}", "version": 1, "op": "u", "name": f"name-{ident}-1", "amount": round(rng.uniform(0, 1e4), 2),
        "qty": rng.randint(0, 1000), "ts": f"2026-01-{1 + ident % 28:02d}T00:00:00Z",
    }


def fold(paths: list[Path]) -> dict[str, int]:
    """Per id the greatest version, ids whose greatest version is a delete left out: the expected current state."""
    best: dict[str, tuple[int, bool]] = {}
    for path in paths:
        with path.open("rb") as handle:
            for line in handle:
                event = orjson.loads(line)
                seen = best.get(event["id"])
                if seen is None or event["version"] > seen[0]:
                    best[event["id"]] = (event["version"], event["op"] == "d")
    return {key: version for key, (version, deleted) in best.items() if not deleted}


def lines_in(paths: list[Path]) -> int:
    """Input lines over ``paths``."""
    return sum(path.read_bytes().count(b"\n") for path in paths)


# --- contenders -------------------------------------------------------------------------


def idem_config(directory: Path) -> Path:
    """idem.yaml: one file-drop connector, the ``event`` table in ``mode: upsert`` ordered by ``version``."""
    config = {
        "connectors": [{"name": "events", "kind": "filedrop", "path": "drop", "record_type": "event", "id_field": "id"}],
        "tables": {"event": {
            "mode": "upsert", "order_by": "version", "delete_when": {"field": "op", "equals": "d"},
            "columns": {"version": "long", "op": "string", "name": "string", "amount": "real", "qty": "int", "ts": "timestamp"},
        }},
        "spark": {"conf": {"spark.ui.enabled": "false"}},
    }
    (directory / "drop").mkdir(parents=True, exist_ok=True)
    path = directory / "idem.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class Setup:
    """What every contender's run needs."""

    server_url: str
    workdir: Path
    config: Path
    idem_home: Path
    master: str
    peer_python: Path
    peer_home: Path


def run_idem_files(setup: Setup, url: str, paths: list[Path]) -> tuple[float, dict[str, Any]]:
    """``idem ingest`` of ``paths`` as a child process into ``url``: wall seconds and its summary."""
    env = environment(url, setup.idem_home, setup.master, "auto")
    args = ["ingest", "--config", str(setup.config), "--connector", "events", *map(str, paths)]
    wall, summary, _driver, _jvm = run_idem("idem upsert", args, env)
    return wall, summary


def idem_state(url: str) -> dict[str, int]:
    """idem's current state: ``idem.event_current``'s id → version."""
    with psycopg.connect(url) as conn:
        return {key: version for key, version in conn.execute("SELECT _external_id, version FROM idem.event_current")}


HAND_TABLE = """CREATE TABLE IF NOT EXISTS events (
    id text PRIMARY KEY, version bigint NOT NULL, op text, name text, amount double precision, qty integer,
    ts timestamptz, deleted boolean NOT NULL)"""
HAND_APPLY = """INSERT INTO events (id, version, op, name, amount, qty, ts, deleted)
    SELECT DISTINCT ON (id) id, version, op, name, amount, qty, ts, op = 'd' FROM staging ORDER BY id, version DESC
    ON CONFLICT (id) DO UPDATE SET version = excluded.version, op = excluded.op, name = excluded.name,
        amount = excluded.amount, qty = excluded.qty, ts = excluded.ts, deleted = excluded.deleted
    WHERE excluded.version > events.version"""


def run_hand_files(url: str, paths: list[Path]) -> float:
    """The hand-written upsert: per file, one transaction: COPY to a temporary staging table, then the
    ``INSERT … ON CONFLICT DO UPDATE … WHERE newer`` (deletes as a tombstone flag). Seconds."""
    started = time.monotonic()
    with psycopg.connect(url) as conn:
        conn.execute(HAND_TABLE)
        conn.commit()
        for path in paths:
            conn.execute("CREATE TEMP TABLE staging (id text, version bigint, op text, name text, amount double precision, "
                         "qty integer, ts timestamptz) ON COMMIT DROP")
            with conn.cursor().copy("COPY staging FROM STDIN") as copy, path.open("rb") as handle:
                for line in handle:
                    event = orjson.loads(line)
                    copy.write_row((event["id"], event["version"], event["op"], *(event.get(name) for name in FIELDS)))
            conn.execute(HAND_APPLY)
            conn.commit()
    return time.monotonic() - started


def hand_state(url: str) -> dict[str, int]:
    """The hand-written table's current state: rows not flagged deleted."""
    with psycopg.connect(url) as conn:
        return {key: version for key, version in conn.execute("SELECT id, version FROM events WHERE NOT deleted")}


def run_dlt_files(setup: Setup, url: str, paths: list[Path], *, base: bool = False, keep: bool = False) -> tuple[float, float]:
    """``upsert_dlt_peer.py`` in the peers' venv as a child process, like idem's runs: its wall seconds
    (interpreter and dlt's import included) and the seconds of its pipeline runs alone."""
    command = [str(setup.peer_python), str(HERE / "upsert_dlt_peer.py"), "--uri", url, "--dataset", "dlt_upsert",
               *(["--base"] if base else []), *(["--keep"] if keep else []), *map(str, paths)]
    env = {**os.environ, "IDEM_PEER_BENCH_HOME": str(setup.peer_home), "RUNTIME__DLTHUB_TELEMETRY": "false"}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"dlt failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
    return wall, float(json.loads(done.stdout.strip().splitlines()[-1])["wall_s"])


def dlt_state(url: str) -> dict[str, int]:
    """dlt's current state: its ``events`` table (hard-deleted rows are gone)."""
    with psycopg.connect(url) as conn:
        return {key: version for key, version in conn.execute("SELECT id, version FROM dlt_upsert.events")}


STATES = {"idem": idem_state, "hand": hand_state, "dlt": dlt_state}


def differing(state: dict[str, int], expected: dict[str, int]) -> int:
    """Identities whose current row (or its absence) differs from the fold's."""
    keys = state.keys() | expected.keys()
    return sum(1 for key in keys if state.get(key) != expected.get(key))


def run_tool(setup: Setup, tool: str, url: str, paths: list[Path]) -> tuple[float, dict[str, Any]]:
    """One contender's load of ``paths`` into the fresh database ``url``: seconds and details."""
    checkpoint(setup.server_url)
    if tool == "idem":
        wall, summary = run_idem_files(setup, url, paths)
        keys = ("rows_written", "rows_skipped", "rows_rejected", "seconds")
        return wall, {k: summary.get(k) for k in keys} | {"upsert": summary.get("upsert") or summary.get("tables")}
    if tool == "hand":
        return run_hand_files(url, paths), {}
    wall, inside = run_dlt_files(setup, url, paths)
    return wall, {"pipeline_runs_s": inside}


def check_state(tool: str, url: str, expected: dict[str, int]) -> int:
    """Identities where ``tool``'s current state differs from the fold."""
    return differing(STATES[tool](url), expected)


def run_rounds(setup: Setup, paths: list[Path], expected: dict[str, int], rounds: int, lines: int) -> list[Result]:
    """The 10 files per contender per round, each into a fresh database, the order rotating."""
    out = []
    for round_ in range(1, rounds + 1):
        order = TOOLS[(round_ - 1) % 3 :] + TOOLS[: (round_ - 1) % 3]
        for tool in order:
            quiet_server(setup.server_url)
            url = fresh_database(setup.server_url, f"upsert_{tool}_{round_}")
            wall, details = run_tool(setup, tool, url, paths)
            details["differing_identities"] = check_state(tool, url, expected)
            drop_database(setup.server_url, url)
            out.append(Result(tool, "10 files", round_, wall, lines, details))
            print(f"round {round_} {tool}: {wall:.2f} s, {details['differing_identities']:,} identities differ from the fold", flush=True)
    return out


def run_fixed_cost(setup: Setup, one_line: Path) -> list[Result]:
    """A 1-line file into a fresh database, per contender: what a run costs whatever its size."""
    out = []
    for tool in TOOLS:
        url = fresh_database(setup.server_url, f"upsert_one_{tool}")
        wall, _ = run_tool(setup, tool, url, [one_line])
        drop_database(setup.server_url, url)
        out.append(Result(tool, "1-line file (fixed cost)", 0, wall, 1))
        print(f"fixed cost {tool}: {wall:.2f} s", flush=True)
    return out


def run_delta(setup: Setup, base: Path, delta: Path, base_rows: int) -> list[Result]:
    """The daily-delta case per contender: the base loaded untimed by its fast path, then the delta timed."""
    expected = fold([base, delta])
    lines = lines_in([delta])
    out = []
    for tool in TOOLS:
        quiet_server(setup.server_url)
        url = fresh_database(setup.server_url, f"upsert_delta_{tool}")
        started = time.monotonic()
        if tool == "idem":
            run_idem_files(setup, url, [base])
        elif tool == "hand":
            run_hand_files(url, [base])
        else:
            run_dlt_files(setup, url, [base], base=True)
        base_seconds = time.monotonic() - started
        quiet_server(url)
        checkpoint(setup.server_url)
        if tool == "dlt":
            wall, inside = run_dlt_files(setup, url, [delta], keep=True)
            details: dict[str, Any] = {"pipeline_runs_s": inside}
        else:
            wall, details = run_tool(setup, tool, url, [delta])
        details |= {"base_rows": base_rows, "base_load_s": round(base_seconds, 2), "differing_identities": check_state(tool, url, expected)}
        drop_database(setup.server_url, url)
        out.append(Result(tool, f"daily delta on {base_rows:,} rows", 1, wall, lines, details))
        print(f"delta {tool}: base {base_seconds:.1f} s (untimed), delta {wall:.2f} s, "
              f"{details['differing_identities']:,} identities differ from the fold", flush=True)
    return out


def summarize(results: list[Result]) -> list[dict[str, Any]]:
    """Per (tool, phase): median / min / max seconds, rows/s of the median, identities differing (max over rounds)."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result.phase, result.tool), []).append(result)
    rows: list[dict[str, Any]] = []
    for (phase, tool), runs in groups.items():
        walls = [r.wall for r in runs]
        median = statistics.median(walls)
        differ = [r.details["differing_identities"] for r in runs if "differing_identities" in r.details]
        rows.append({
            "tool": tool, "phase": phase, "rounds": len(runs), "records": runs[0].records, "median_s": round(median, 3),
            "min_s": round(min(walls), 3), "max_s": round(max(walls), 3),
            "rows_per_s": round(runs[0].records / median) if median and runs[0].records > 1 else None,
            "differing_identities": max(differ) if differ else None,
        })
    seconds: dict[tuple[str, str], float] = {(row["phase"], row["tool"]): float(row["median_s"]) for row in rows}
    for row in rows:
        own = seconds[(row["phase"], row["tool"])]
        if row["tool"] == "idem" and own:
            row["ratios"] = {
                peer: round(seconds[(row["phase"], peer)] / own, 3) for peer in ("hand", "dlt") if seconds.get((row["phase"], peer))
            }
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """The results: one line per phase and contender; the ratios are idem's rows/s over the peer's."""
    print(f"{'phase':32} {'tool':5} {'median s':>9} {'min–max s':>15} {'rows/s':>9} {'differ':>8} {'idem/hand':>10} {'idem/dlt':>9}")
    for row in rows:
        ratios = row.get("ratios", {})
        span = f"{row['min_s']:.2f}–{row['max_s']:.2f}"
        differ = "—" if row["differing_identities"] is None else f"{row['differing_identities']:,}"
        print(f"{row['phase'][:32]:32} {row['tool']:5} {row['median_s']:9.2f} {span:>15} {row['rows_per_s'] or 0:9,} {differ:>8} "
              + "".join(f" {ratios[p]:>9.2f}" if p in ratios else f" {'':>9}" for p in ("hand", "dlt")))


def problems(results: list[Result]) -> list[str]:
    """idem's and the hand-written upsert's states must equal the fold (dlt's may differ: last write wins)."""
    return [f"{r.tool} {r.phase} round {r.round}: {r.details['differing_identities']:,} identities differ from the fold"
            for r in results if r.tool != "dlt" and r.details.get("differing_identities")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000, help="change events (lines) in the 10 files")
    parser.add_argument("--delta-base", type=int, default=10_000_000, help="rows of the daily-delta case's table (0: skip it)")
    parser.add_argument("--shared", help="the shared benchmark directory (default: $IDEM_SHARED_BENCH, else ../shared/bench)")
    parser.add_argument("--postgres", help="a running server's URL instead of pg_up.sh's")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default=str(HERE / "data" / "upsert"))
    parser.add_argument("--out", help="results as JSON (default: <workdir>/results-<time>.json)")
    args = parser.parse_args()
    workdir, out_path, machine = begin_run(args.workdir, args.out)
    paths = write_events(workdir, args.records, 10)
    one_line = workdir / "one.ndjson"
    one_line.write_bytes(paths[0].read_bytes().split(b"\n", 1)[0] + b"\n")
    expected = fold(paths)
    lines = lines_in(paths)
    print(f"data: {lines:,} lines in {len(paths)} files, {len({*expected}):,} identities current in the fold", flush=True)
    delta = write_delta(workdir, args.delta_base) if args.delta_base else None
    os.sync()
    results: list[Result] = []
    home = peer_bench_home()
    try:
        with spark_on_bench_server(args.postgres, args.shared, workdir / "dagster_home") as (server, facts):
            setup = Setup(server.url, workdir, idem_config(workdir), workdir / "dagster_home", args.master, peer_python(home), home)
            print(f"server: {masked_url(server.url)} (PostgreSQL {facts['server_version']})", flush=True)
            warm = fresh_database(server.url, "upsert_warm")
            start_spark_server_for(setup.idem_home, args.master, setup.config, environment(warm, setup.idem_home, args.master, "auto"))
            drop_database(server.url, warm)
            results += run_fixed_cost(setup, one_line)
            results += run_rounds(setup, paths, expected, args.rounds, lines)
            if delta:
                results += run_delta(setup, delta[0], delta[1], args.delta_base)
    except SetupError as exc:
        print(f"upsert_bench: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"upsert_bench: {exc}", file=sys.stderr)
        return 1
    rows = summarize(results)
    print(f"\n{args.rounds} round(s), median shown; rows/s = input lines / median seconds; idem/hand, idem/dlt = idem's rows/s "
          "over the peer's; differ = identities whose current row differs from the fold of the events")
    print_table(rows)
    failed = problems(results)
    for line in failed:
        print(f"CHECK FAILED: {line}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "benchmark": "upsert_bench", "args": vars(args), "machine": machine, "server": server_record(server, facts),
        "data": {"lines": lines, "files": len(paths), "current_identities": len(expected), "seed": SEED},
        "summary": rows, "problems": failed, "results": [asdict(r) for r in results],
    }, indent=1, default=str), encoding="utf-8")
    print(f"results: {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
