"""idem_platform beside its peers on the shared benchmark (issue 18): one run, one server.

    python benchmarks/shared_bench.py [--rounds 3] [--records 1000000] [--shared DIR] [--postgres URL]
                                      [--out results.json] [--skip-small] [--stix-count 24772]

What it needs: the shared benchmark (``../shared/bench`` beside the repository, or
``--shared DIR`` / ``$IDEM_SHARED_BENCH``; it is not part of this repository, its
scripts are called, never copied) and, unless ``--postgres URL`` names a running
server, Debian's PostgreSQL binaries for its ``pg_up.sh`` (a private server on
127.0.0.1:55432, user bench; started if not running, and then stopped at the end).
The peers run in their own venv (``$IDEM_PEER_BENCH_HOME/.venv``), created as
``run.sh`` creates it when missing, on the data ``run.sh`` uses (``gen.py``: N records
in 10 files, 10 % duplicate lines; generated when missing).

Each round, tools in a rotating order (so drift hits every tool alike), each tool after a
``VACUUM (ANALYZE)`` of the peers' database (the last tool's tables, which autovacuum
would otherwise process during the next tool's run), every timed phase after a CHECKPOINT:

* ``bench_copy.py --variant copy_pk --variant stage_oc`` and ``bench_dlt.py --variant
  arrow_csv --variant arrow_csv_insert_only --tuned``, once each (their first load and their replay, as they define them);
* idem_platform, ``idem ingest`` as a child process (interpreter, Dagster, a cold Spark
  session and the commit included): (a) the 10 files, fresh database; (b) the same rows
  in 10 new files (each file's lines in reverse order: new bytes, so new file keys, and
  every row an idempotent skip); (d) the 10 committed files again (a replay); (c) the
  same bytes as ONE file (the 10 concatenated) into another fresh database; and, with the
  Spark Connect server, (e) the 10 files into a fresh database as a one-off ``idem ingest``
  with nothing running, cold (``IDEM_SPARK_SERVER=off``: the run starts its own JVM);
* the small cases of ``small_bench.py`` (a 1-line file: the fixed cost; a 1,000-line
  file; the 24,772-object STIX-like batch), unless ``--skip-small``.

With the Spark Connect server (``--spark-server auto``, the default), two runs precede the
rounds and are reported apart: the 1-line run that starts the server, then the server's
first large run (the 10 files into a fresh database), in which its JIT compiles the
staging path (see :func:`warm_spark_server`).

Prints the data's shape, one row per tool and phase (median seconds over the rounds,
min–max, rows/s = input lines / median seconds, the time inside the run for idem, and
the ratio of rows/s to copy_pk, stage_oc and dlt for the comparable phase: first loads
to first loads, new files and replays to the peers' replays — copy_pk has only a first
load), and the issue's goals as met / not met. ``--out`` writes it all as JSON. Exit
status 1 if any phase did not do what it must (written / skipped counts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks import stix_gen  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    BenchServer,
    SetupError,
    begin_run,
    bench_server,
    environment,
    fresh_database,
    masked_url,
    peer_bench_home,
    quiet_server,
    server_facts,
    server_record,
    shared_bench_dir,
    stop_spark_server,
)
from benchmarks.small_bench import (  # noqa: E402
    SmallData,
    Timed,
    drop_database,
    expect,
    ingest,
    prepare_small,
    print_rows,
    run_small,
    start_spark_server,
    summarize,
)

HERE = Path(__file__).resolve().parent
PEER_PACKAGES = ("dlt[postgres]>=1.4", "psycopg[binary]>=3.2", "orjson", "pyarrow")  # as run.sh installs them
FIRST, NEW_FILES, ONE_FILE, REPLAY = (
    "first ingest (10 files)", "same rows, 10 new files", "same bytes as one file", "replay (committed files)",
)
COLD = "first ingest (10 files), cold: a JVM of its own"
SERVER_WARM = "the server's first large run (10 files, before the rounds)"
# Which peer phase each idem phase is compared with.
PEER_PHASE = {FIRST: "first", COLD: "first", ONE_FILE: "first", NEW_FILES: "replay", REPLAY: "replay"}
# dlt in both strategies a user would pick: delete-insert (its default merge) and insert-only
# (dlt >= 1.24: skip a row whose key exists, idem's own promise for rows).
PEERS = {
    "copy_pk": ("copy", "copy_pk"),
    "stage_oc": ("copy", "stage_oc"),
    "dlt": ("dlt", "arrow_csv+tuned"),
    "dlt_io": ("dlt", "arrow_csv_insert_only+tuned"),
}


def config_for_peer_data(directory: Path) -> Path:
    """idem.yaml for gen.py's records: the peers' typed columns (bench_copy.py's table) per type."""
    columns = {
        "name": {"type": "string", "required": True},
        "confidence": "int",
        "score": "real",
        "created": "timestamp",
        "labels": "dynamic",
        "tags": "dynamic",
        "embedding": "vector(8)",
    }
    config = {
        "connectors": [{"name": "feed", "kind": "filedrop", "path": "drop", "record_type_field": "type", "id_field": "id"}],
        "tables": {kind: {"columns": columns} for kind in ("indicator", "malware", "threat-actor")},
        "spark": {"conf": {"spark.ui.enabled": "false"}},
    }
    (directory / "drop").mkdir(parents=True, exist_ok=True)
    path = directory / "idem.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def peer_python(home: Path) -> Path:
    """The peers' interpreter, ``$IDEM_PEER_BENCH_HOME/.venv``, made as run.sh makes it if it is missing
    (or lacks a package: an earlier install that stopped half way)."""
    python = home / ".venv" / "bin" / "python"
    probe = [str(python), "-c", "import dlt, psycopg, orjson, pyarrow"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    base = shutil.which("python3")
    if base is None:
        raise SetupError("no python3 on PATH to make the peers' venv with (run.sh needs one too)")
    print(f"making the peers' venv {home / '.venv'} (as run.sh does: {', '.join(PEER_PACKAGES)})", flush=True)
    for command in ([base, "-m", "venv", str(home / ".venv")], [str(home / ".venv" / "bin" / "pip"), "install", "-q", *PEER_PACKAGES]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SetupError(f"making the peers' venv failed: {' '.join(command)}: {(done.stderr or done.stdout).strip()[-2000:]}")
    return python


def peer_data(shared: Path, python: Path, home: Path, records: int) -> Path:
    """run.sh's data directory for ``records`` (gen.py: 10 files, 10 % duplicates, seed 42), made if missing."""
    data = home / "data" / f"n{records}"
    if not (data / "manifest.json").is_file():
        print(f"generating the shared data: {records:,} records in 10 files -> {data}", flush=True)
        command = [str(python), str(shared / "gen.py"), "-n", str(records), "--dup-rate", "0.1", "--files", "10", "--out", str(data)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SetupError(f"gen.py failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return data


def data_shape(data: Path) -> dict[str, Any]:
    """Files, bytes, records (lines), unique records and records per type of the shared data."""
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    files = [data / entry["path"] for entry in manifest["files"]]
    types: Counter[str] = Counter()
    lines = 0
    prefix = b'{"type":"'
    for path in files:
        with path.open("rb") as handle:
            for line in handle:
                lines += 1
                if line.startswith(prefix):
                    types[line[len(prefix) : line.index(b'"', len(prefix))].decode()] += 1
                else:
                    types[str(json.loads(line).get("type"))] += 1
    return {
        "directory": str(data),
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "records": lines,
        "unique_records": manifest["n_unique"],
        "duplicate_lines": manifest["n_dup_lines"],
        "types": dict(sorted(types.items())),
        "seed": manifest["seed"],
        "sha256": [entry["sha256"] for entry in manifest["files"]],
    }


def prepare_idem_inputs(data: Path, shape: dict[str, Any], workdir: Path) -> tuple[list[Path], list[Path], Path]:
    """The 10 files as they are, the same lines in 10 new files (each file's lines reversed) and
    the 10 concatenated as one file; the last two written once per data set (not timed)."""
    files = [data / name for name in sorted(os.listdir(data)) if name.endswith(".ndjson")]
    stamp = hashlib.sha256("".join(shape["sha256"]).encode()).hexdigest()[:16]
    target = workdir / f"n{shape['records']}-{stamp}"
    new_dir, one = target / "new", target / "one" / "all.ndjson"
    if not (target / "done").exists():
        shutil.rmtree(target, ignore_errors=True)
        new_dir.mkdir(parents=True)
        one.parent.mkdir(parents=True)
        with one.open("wb") as joined:
            for path in files:
                content = path.read_bytes()
                joined.write(content)
                lines = content.splitlines(keepends=True)
                lines.reverse()
                (new_dir / path.name).write_bytes(b"".join(lines))
        (target / "done").write_text(stamp, encoding="utf-8")
    return files, sorted(new_dir.iterdir()), one


def run_peer(
    tool: str, python: Path, shared: Path, args: list[str], server_url: str, home: Path, log: Path, round_: int, records: int
) -> list[Timed]:
    """One peer script, once (``--reps 1``), in its own venv from its own directory, as run.sh runs it;
    its result lines (the JSON it prints per phase) become rows."""
    env = {**os.environ, "BENCH_PG_URI": server_url, "IDEM_PEER_BENCH_HOME": str(home), "RUNTIME__DLTHUB_TELEMETRY": "false"}
    started = time.monotonic()
    done = subprocess.run([str(python), *args], cwd=shared, env=env, capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{tool}: {' '.join(args)} failed (exit {done.returncode}; log {log}):\n{(done.stderr or done.stdout)[-3000:]}")
    out = []
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        result = json.loads(line)
        if "tool" not in result or "wall_s" not in result:
            continue
        counts = {k: result[k] for k in ("rows_copied", "inserted", "final_rows") if k in result}
        out.append(Timed(result["tool"], f"{result['variant']} {result['phase']}", round_, float(result["wall_s"]), records, None, counts, result))
    if not out:
        raise RuntimeError(f"{tool}: printed no results in {time.monotonic() - started:.0f} s (log {log})")
    return out


def run_idem_round(
    server_url: str, config: Path, files: list[Path], new_files: list[Path], one: Path, shape: dict[str, Any],
    master: str, home: Path, round_: int, spark_server: str,
) -> list[Timed]:
    """idem's phases of one round: (a) 10 files, (b) new files, (d) replay, then (c) one file, fresh;
    with the Spark Connect server (``auto``), (e) the 10 files again, fresh, as a one-off ``idem
    ingest`` with nothing running (``IDEM_SPARK_SERVER=off``: the run starts its own JVM)."""
    n, unique = shape["records"], shape["unique_records"]
    url = fresh_database(server_url, f"idem_shared_{round_}")
    env = environment(url, home, master, spark_server)
    out = [
        expect(ingest("idem", FIRST, round_, files, n, env, config, "feed", server_url), rows_written=unique, rows_skipped=n - unique),
        expect(ingest("idem", NEW_FILES, round_, new_files, n, env, config, "feed", server_url), rows_written=0, rows_skipped=n),
        expect(ingest("idem", REPLAY, round_, files, n, env, config, "feed", server_url), rows_written=0, replayed=True),
    ]
    drop_database(server_url, url)
    url = fresh_database(server_url, f"idem_shared_one_{round_}")
    env = environment(url, home, master, spark_server)
    out.append(expect(ingest("idem", ONE_FILE, round_, [one], n, env, config, "feed", server_url), rows_written=unique, rows_skipped=n - unique))
    drop_database(server_url, url)
    if spark_server == "auto":
        url = fresh_database(server_url, f"idem_shared_cold_{round_}")
        env = environment(url, home, master, "off")
        out.append(expect(ingest("idem", COLD, round_, files, n, env, config, "feed", server_url), rows_written=unique, rows_skipped=n - unique))
        drop_database(server_url, url)
    return out


def warm_spark_server(
    server_url: str, config: Path, files: list[Path], shape: dict[str, Any], master: str, home: Path
) -> Timed:
    """The new server's first large run, before the rounds (reported apart, in no median).

    A Spark Connect server compiles its staging path with the JVM's C2 compiler during its
    first large runs: its compiler threads took 5.5 CPU-s of its first 1M-record first
    ingest and ~0.75 per run once warm, on a two-core machine where that is 2–3 s of wall
    time. The rounds measure the server as runs find it once it has been up a while (it
    is started once and stays up); this run is that first large one, shown for what it
    costs.
    """
    url = fresh_database(server_url, "idem_shared_warm")
    env = environment(url, home, master, "auto")
    done = expect(
        ingest("idem", SERVER_WARM, 0, files, shape["records"], env, config, "feed", server_url),
        rows_written=shape["unique_records"], rows_skipped=shape["records"] - shape["unique_records"],
    )
    drop_database(server_url, url)
    print(f"{SERVER_WARM}: {done.wall:.2f} s", flush=True)
    return done


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's rows/s over each peer's rows/s in the comparable phase (first ↔ first; new files,
    replays ↔ replay; copy_pk has a first load only)."""
    seconds = {(row["tool"], row["phase"]): row["median_s"] for row in rows}
    for row in rows:
        if row["tool"] == "idem":
            kind = PEER_PHASE.get(row["phase"])
        elif row["tool"] in ("copy", "dlt"):
            kind = row["phase"].rsplit(" ", 1)[-1]
        else:
            kind = None
        if kind is None:
            continue
        ratios = {}
        for name, (tool, variant) in PEERS.items():
            peer = seconds.get((tool, f"{variant} {kind}")) or seconds.get((tool, f"{variant} first"))
            if peer and row["median_s"]:
                ratios[name] = round(peer / row["median_s"], 3)
        row["ratios"] = ratios


def goals(rows: list[dict[str, Any]], cold_first: bool = False) -> list[dict[str, Any]]:
    """The issue's targets, each with its figure and whether this run met it (``cold_first``:
    the rounds' first ingest itself started its own JVM, ``--spark-server off``)."""
    by = {(row["tool"], row["phase"]): row for row in rows}
    out: list[dict[str, Any]] = []

    def goal(text: str, value: float | None, met: bool | None) -> None:
        out.append({"goal": text, "value": value, "met": met})

    first, new, one = by.get(("idem", FIRST)), by.get(("idem", NEW_FILES)), by.get(("idem", ONE_FILE))
    cases = ((first, 1.0, "cold"),) if cold_first else ((first, 1.2, "warm"), (by.get(("idem", COLD)), 1.0, "cold"))
    for row, least, case in cases:
        if row:
            ratios = row.get("ratios", {})
            fastest_dlt = min((ratios[k] for k in ("dlt", "dlt_io") if k in ratios), default=None)
            goal(f"first ingest ≥ {least} × the faster dlt strategy {case} (ratio)", fastest_dlt, fastest_dlt >= least if fastest_dlt is not None else None)
    if first:
        ratios = first.get("ratios", {})
        goal("first ingest ≥ 0.8 × staging + ON CONFLICT (ratio to stage_oc ≥ 0.8)", ratios.get("stage_oc"), ratios.get("stage_oc", 0) >= 0.8 if "stage_oc" in ratios else None)
        goal("steady: the rounds of the 10-file batch within 15 % ((max − min) / min)", first["spread"], first["spread"] <= 0.15 if first["rounds"] >= 3 and first["spread"] is not None else None)
    if new:
        ratios = new.get("ratios", {})
        fastest_reload = min((ratios[k] for k in ("dlt", "dlt_io") if k in ratios), default=None)
        goal("same rows in new files ≥ 2 × the faster dlt reload (ratio)", fastest_reload, fastest_reload >= 2 if fastest_reload is not None else None)
    if first and one:
        gap = round(abs(first["median_s"] - one["median_s"]) / one["median_s"], 3)
        goal("the same bytes as 10 files within 10 % of one file", gap, gap <= 0.10)
    for row in rows:
        if row["tool"] == "idem" and row["phase"].endswith("-line file") and row["records"] == 1000 and not cold_first:
            goal("a 1,000-line file ≤ 2 s inside a warm run (its Dagster run)", row.get("dagster_run_median_s"), (row.get("dagster_run_median_s") or 99) <= 2)
        if row["tool"] == "idem" and row["phase"].startswith("STIX batch"):
            goal(f"{row['phase']} ≥ 5,000 rows/s", row["rows_per_s"], (row["rows_per_s"] or 0) >= 5000)
    return out


def print_first_ingest_rounds(results: list[Timed], loads: dict[int, float]) -> None:
    """Where each round's first ingest spent its time (the commit's own timings), beside the
    machine's load as the round began: what to read when the rounds are not within 15 %."""
    firsts = [t for t in results if t.tool == "idem" and t.phase == FIRST]
    if not firsts:
        return
    keys = ("prepare_seconds", "stage_and_insert_seconds", "insert_seconds", "commit_seconds")
    print(f"\n{FIRST}, per round: wall / inside the run / " + " / ".join(k.removesuffix("_seconds") for k in keys) + " (s), driver / JVM MiB, load")
    for t in firsts:
        timings = t.details.get("timings") or {}
        parts = " / ".join(f"{timings[k]:.2f}" if isinstance(timings.get(k), int | float) else "—" for k in keys)
        print(
            f"  round {t.round}: {t.wall:.2f} / {f'{t.inside:.2f}' if t.inside is not None else '—'} / {parts}, "
            f"{t.details.get('driver_mib')} / {t.details.get('jvm_mib')} MiB, load {loads.get(t.round)}"
        )


def parse_args() -> argparse.Namespace:
    """The command line: the rounds, the data's size, where the shared benchmark and the server
    are, which small cases, and how idem's runs get their Spark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000, help="gen.py's N (10 files, 10 %% duplicates)")
    parser.add_argument("--shared", help="the shared benchmark directory (default: $IDEM_SHARED_BENCH, else ../shared/bench)")
    parser.add_argument(
        "--postgres",
        help="a running server's URL instead of pg_up.sh's (the peers use its database; dlt needs a password in it "
        "unless the user is bench — any, under trust auth); idem makes fresh databases on it",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--skip-small", action="store_true", help="leave out the 1-line, 1,000-line and STIX cases")
    parser.add_argument("--stix-count", type=int, default=stix_gen.COUNT)
    parser.add_argument("--workdir", default=str(HERE / "data" / "shared"))
    parser.add_argument("--out", help="results as JSON (default: <workdir>/results-<time>.json)")
    parser.add_argument("--spark-server", choices=("auto", "off"), default="auto",
                        help="auto (idem ingest's default): idem's runs share a long-lived Spark Connect server, "
                        "started by a first run timed apart; off: a JVM per run")
    return parser.parse_args()


@dataclass
class Inputs:
    """What every round runs on, prepared once before the rounds so no round pays for it: the
    server and its settings, the peers' venv and data, idem's copies of the data and its
    configs, the small cases, and where idem's Dagster home and the peers' logs go."""

    server: BenchServer
    facts: dict[str, Any]
    shared: Path
    home: Path
    python: Path
    data: Path
    shape: dict[str, Any]
    files: list[Path]
    new_files: list[Path]
    one: Path
    config: Path
    small: SmallData
    idem_home: Path
    logs: Path


def prepare(args: argparse.Namespace, workdir: Path, home: Path, shared: Path, server: BenchServer) -> Inputs:
    """The peers' venv and data (made when missing), idem's inputs and configs, the small cases."""
    python = peer_python(home)
    data = peer_data(shared, python, home, args.records)
    shape = data_shape(data)
    files, new_files, one = prepare_idem_inputs(data, shape, workdir)
    config = config_for_peer_data(workdir)
    small = prepare_small(workdir / "small", args.stix_count)  # its 1-line file starts the Spark server
    os.sync()  # the inputs just written (~0.8 GB in a new work directory) on disk now, not during a timed run
    facts = server_facts(server.url)
    return Inputs(server, facts, shared, home, python, data, shape, files, new_files, one, config, small,
                  idem_home=workdir / "dagster_home", logs=workdir / "logs")


def print_setup(args: argparse.Namespace, inputs: Inputs) -> None:
    """What the run is about to measure, before the long part: the server, the data, idem's Spark."""
    server, facts, shape, small = inputs.server, inputs.facts, inputs.shape, inputs.small
    print(
        f"server: {masked_url(server.url)} ({server.via}{', started here' if server.started else ''}; "
        f"PostgreSQL {facts['server_version']}, shared_buffers {facts.get('shared_buffers')})\n"
        f"data: {shape['files']} files, {shape['bytes']:,} bytes, {shape['records']:,} records "
        f"({shape['unique_records']:,} unique, {shape['duplicate_lines']:,} duplicate lines), types "
        + ", ".join(f"{k} {v:,}" for k, v in shape["types"].items()),
        flush=True,
    )
    if not args.skip_small:
        print(f"STIX-like batch: {small.stix_shape['objects']:,} objects, {len(small.stix_shape['types'])} types, {small.stix_shape['bytes']:,} bytes", flush=True)
    print(f"idem's Spark: {args.master}, {'a long-lived Spark Connect server' if args.spark_server == 'auto' else 'a JVM per run'}", flush=True)


def run_tool(tool: str, round_: int, args: argparse.Namespace, inputs: Inputs) -> list[Timed]:
    """One tool's turn in a round: a peer's script as run.sh runs it, or idem's four phases."""
    url, records, logs = inputs.server.url, inputs.shape["records"], inputs.logs
    if tool == "copy":
        script = ["bench_copy.py", "--data", str(inputs.data), "--reps", "1", "--variant", "copy_pk", "--variant", "stage_oc"]
        return run_peer(tool, inputs.python, inputs.shared, script, url, inputs.home, logs / f"round{round_}-copy.log", round_, records)
    if tool == "dlt":
        script = ["bench_dlt.py", "--data", str(inputs.data), "--reps", "1", "--variant", "arrow_csv", "--variant", "arrow_csv_insert_only", "--tuned"]
        return run_peer(tool, inputs.python, inputs.shared, script, url, inputs.home, logs / f"round{round_}-dlt.log", round_, records)
    return run_idem_round(
        url, inputs.config, inputs.files, inputs.new_files, inputs.one, inputs.shape, args.master, inputs.idem_home, round_, args.spark_server
    )


def run_rounds(args: argparse.Namespace, inputs: Inputs) -> tuple[list[Timed], dict[int, float]]:
    """The rounds: the tools in an order that rotates each round (so drift hits every tool
    alike), then the small cases. Returns the timings and the 1-minute load average as each
    round began (to read a round that stands out by)."""
    results: list[Timed] = []
    loads: dict[int, float] = {}
    tools = ["copy", "dlt", "idem"]
    for round_ in range(1, args.rounds + 1):
        loads[round_] = round(os.getloadavg()[0], 2)
        order = tools[(round_ - 1) % 3 :] + tools[: (round_ - 1) % 3]
        for tool in order:
            quiet_server(inputs.server.url)  # the last tool's tables vacuumed and analyzed now, not during this one
            done = run_tool(tool, round_, args, inputs)
            results += done
            print(f"round {round_} {tool}: " + ", ".join(f"{t.phase} {t.wall:.2f}s" for t in done), flush=True)
        if not args.skip_small:
            done = run_small(inputs.server.url, inputs.small, args.master, inputs.idem_home, round_, prefix="idem_shared_small", spark_server=args.spark_server)
            results += done
            print(f"round {round_} small: " + ", ".join(f"{t.phase} {t.wall:.2f}s" for t in done), flush=True)
    return results, loads


def measure(args: argparse.Namespace, workdir: Path, home: Path) -> tuple[Inputs, list[Timed], dict[int, float]]:
    """Everything timed, on one server (stopped at the end if started here), the Spark server
    stopped whatever happened; with ``--spark-server auto`` its start and first large run
    come first, reported apart."""
    shared = shared_bench_dir(args.shared)
    with bench_server(args.postgres, args.shared) as server:
        inputs = prepare(args, workdir, home, shared, server)
        print_setup(args, inputs)
        try:
            results: list[Timed] = start_spark_server(server.url, inputs.small, args.master, inputs.idem_home, args.spark_server)
            if args.spark_server == "auto":
                results.append(warm_spark_server(server.url, inputs.config, inputs.files, inputs.shape, args.master, inputs.idem_home))
            rounds, loads = run_rounds(args, inputs)
            results += rounds
        finally:
            stop_spark_server(inputs.idem_home)
    return inputs, results, loads


def report(
    args: argparse.Namespace, machine: dict[str, Any], out_path: Path, inputs: Inputs, results: list[Timed], loads: dict[int, float]
) -> int:
    """The medians and ratios as a table, the goals met or not, the first ingest per round; all
    of it as JSON in ``out_path``. Exit status 1 if a phase did not do what it must."""
    shape, server = inputs.shape, inputs.server
    rows = summarize(results)
    add_ratios(rows)
    met = goals(rows, cold_first=args.spark_server == "off")
    print(f"\n{args.rounds} round(s), median shown; rows/s = {shape['records']:,} input lines / median seconds; "
          "ratios = rows/s over the peer's in the comparable phase (first ↔ first, new files and replays ↔ replay)")
    print_rows(rows, ratio_columns=tuple(PEERS))
    print()
    for item in met:
        state = {True: "met", False: "NOT met", None: "n/a"}[item["met"]]
        print(f"{state:8} {item['goal']}: {item['value']}")
    print_first_ingest_rounds(results, loads)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "benchmark": "shared_bench",
        "args": vars(args),
        "machine": machine,
        "server": server_record(server, inputs.facts),
        "data": shape,
        "stix": None if args.skip_small else inputs.small.stix_shape,
        "spark_server": args.spark_server,
        "summary": rows,
        "goals": met,
        "load_average_at_round_start": loads,
        "results": [asdict(t) for t in results],
    }, indent=1, default=str), encoding="utf-8")
    print(f"results: {out_path}")
    return 1 if any(row["problems"] for row in rows) else 0


def main() -> int:
    """Measure (on a server and with inputs made here when missing), then report: exit status 2
    if the setup failed, 1 if a run failed or a phase did not do what it must."""
    args = parse_args()
    workdir, out_path, machine = begin_run(args.workdir, args.out)
    home = peer_bench_home()
    try:
        inputs, results, loads = measure(args, workdir, home)
    except SetupError as exc:
        print(f"shared_bench: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a peer or an idem run failed: its own words, then stop
        print(f"shared_bench: {exc}", file=sys.stderr)
        return 1
    return report(args, machine, out_path, inputs, results, loads)


if __name__ == "__main__":
    sys.exit(main())
