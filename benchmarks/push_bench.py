"""``idem serve``'s push API under load: what a client sees, over a real socket, on real PostgreSQL.

    python benchmarks/push_bench.py [--postgres URL] [--requests 2000] [--keys 200] [--clients 32]
                                    [--records-per-body 5] [--sequential 200] [--repeat 3] [--workdir DIR]

Each round gets a fresh scratch database (``idem_push_bench``, dropped at the end), a
config with one http connector ``push`` (the example's ``indicator`` table) and its own
landing directory, and starts ``idem serve`` as a child process, as a user would
(``python -m idem_platform.cli serve --port <free>``). Then, from this process:

* ``startup``: seconds from the child's start to the first ``/healthz`` 200 (interpreter,
  imports, the config, ``ensure_schema``, uvicorn, the pool's first connection); ``banner``
  is when its start line appeared (everything before uvicorn);
* ``load``: ``--requests`` POSTs over ``--keys`` keys from ``--clients`` threads
  (:func:`idem_platform_tests.helpers.push_load.run_load`: every key once, the rest random
  repeats racing their first request; a ``409`` is retried after ``Retry-After``);
* ``replay``: the same load again: every answer a replay of a recorded one;
* ``sequential``: ``--sequential`` fresh keys from one client, one after another
  (keep-alive connection): the latency of one push with nothing else going on.

The server is stopped with SIGTERM. Every round is checked, and the benchmark fails
if it is not exactly-once: every final answer ``202``, one file key per key, exactly
``--keys`` files in the landing directory and ``--keys`` committed ledger rows under
``http:push`` after the loads (``--keys + --sequential`` after the sequential pushes).

Prints each round, the median of the rounds as a table, and one JSON object last.
CPU rows: CPU milliseconds per request of the server process, of this (the client)
process and of the local PostgreSQL's processes (all of them: other databases' work
counts too; absent for a remote server). On a small machine the client threads, the
server and PostgreSQL share the cores: their sum bounds the requests per second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
import yaml  # noqa: E402
from psycopg import sql  # noqa: E402

from benchmarks.harness import environment, fresh_database  # noqa: E402
from idem_platform.config import load_config  # noqa: E402
from idem_platform.sources.push.server import LOOPBACK, free_port  # noqa: E402
from idem_platform_tests.helpers.push_load import LoadResult, body_for, run_load  # noqa: E402

DATABASE = "idem_push_bench"
CONNECTOR = "push"
NAMESPACE = f"http:{CONNECTOR}"
LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "threatfeed" / "idem.yaml"
NDJSON = "application/x-ndjson"


class BenchmarkFailure(Exception):
    """The server answered wrongly: not exactly-once, or not at all."""


def write_config(directory: Path) -> Path:
    """One http connector ``push`` landing in ``directory/drop/push``, the example's ``indicator`` table."""
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data = {
        "connectors": [
            {
                "name": CONNECTOR,
                "kind": "http",
                "path": "drop/push",
                "record_type_field": "type",
                "id_field": "id",
            }
        ],
        "tables": {"indicator": example["tables"]["indicator"]},
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "idem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


class Server:
    """``idem serve`` as a child process; stderr goes to a file of the round."""

    def __init__(self, config: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log = log
        self._log_handle = log.open("w", encoding="utf-8")
        command = [sys.executable, "-m", "idem_platform.cli", "serve", "--config", str(config)]
        command += ["--port", str(self.port)]
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=self._log_handle
        )
        self.ps = psutil.Process(self.process.pid)

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_healthy(self, timeout: float = 120.0) -> tuple[float, float | None]:
        """Seconds to the first ``/healthz`` 200, and to the start line on stderr."""
        banner: float | None = None
        deadline = self.started + timeout
        with httpx.Client(timeout=5) as client:
            while True:
                now = time.perf_counter()
                if banner is None and "idem serve: http://" in self.stderr():
                    banner = now - self.started
                try:
                    if client.get(f"{self.url}/healthz").status_code == 200:
                        return time.perf_counter() - self.started, banner
                except httpx.TransportError:
                    pass
                if self.process.poll() is not None:
                    raise BenchmarkFailure(
                        f"idem serve exited ({self.process.returncode}):\n{self.stderr()[-4000:]}"
                    )
                if now > deadline:
                    raise BenchmarkFailure(f"idem serve was not healthy after {timeout:.0f} s")
                time.sleep(0.005)

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> float:
        """SIGTERM, wait; seconds to exit. Fails on a traceback or an unexpected exit."""
        started = time.perf_counter()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise BenchmarkFailure("idem serve did not stop within 30 s of SIGTERM") from None
        seconds = time.perf_counter() - started
        self._log_handle.close()
        err = self.stderr()
        if self.process.returncode not in (0, -signal.SIGTERM) or "Traceback" in err:
            raise BenchmarkFailure(
                f"idem serve ended with {self.process.returncode}:\n{err[-4000:]}"
            )
        return seconds


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def postgres_cpu_seconds() -> float | None:
    """CPU seconds of this machine's PostgreSQL processes (every database, every backend
    alive now); ``None`` when there are none to see (a remote server)."""
    total, seen = 0.0, False
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if (proc.info["name"] or "").startswith("postgres") and times is not None:
            total += times.user + times.system
            seen = True
    return total if seen else None


def measured(server: Server, action: Any) -> tuple[Any, dict[str, float | None]]:
    """``action()``'s result, and the CPU seconds spent during it by the server, this
    process (the client) and the local PostgreSQL."""
    before = (server.cpu_seconds(), own_cpu_seconds(), postgres_cpu_seconds())
    result = action()
    after = (server.cpu_seconds(), own_cpu_seconds(), postgres_cpu_seconds())
    pg = None if before[2] is None or after[2] is None else after[2] - before[2]
    return result, {"server": after[0] - before[0], "client": after[1] - before[1], "postgres": pg}


def sequential(base_url: str, count: int, first_key: int, records_per_body: int) -> LoadResult:
    """``count`` fresh keys pushed one after another by one client."""
    result = LoadResult(seconds=0.0)
    url = f"{base_url}/v1/connectors/{CONNECTOR}/records"
    bodies = [body_for(first_key + i, records_per_body) for i in range(count)]
    with httpx.Client(timeout=60) as client:
        started = time.perf_counter()
        for i, payload in enumerate(bodies):
            began = time.perf_counter()
            answer = client.post(
                url,
                content=payload,
                headers={"Content-Type": NDJSON, "Idempotency-Key": f"seq-key-{first_key + i}"},
            )
            result.latencies.append(time.perf_counter() - began)
            result.statuses[answer.status_code] += 1
            if answer.status_code == 202:
                data = answer.json()
                result.file_keys.setdefault(f"seq-key-{first_key + i}", set()).add(data["file_key"])
                result.replayed += bool(data["replayed"])
        result.seconds = time.perf_counter() - started
    return result


def check_answers(name: str, result: LoadResult, requests: int, keys: int, replayed: int | None) -> None:
    problems = []
    if dict(result.statuses) != {202: requests}:
        problems.append(f"final statuses {dict(result.statuses)}, want {{202: {requests}}}")
    if len(result.file_keys) != keys:
        problems.append(f"{len(result.file_keys)} keys answered, want {keys}")
    split = {k: v for k, v in result.file_keys.items() if len(v) != 1}
    if split:
        problems.append(f"{len(split)} keys got several file keys, e.g. {next(iter(split.items()))}")
    if replayed is not None and result.replayed != replayed:
        problems.append(f"{result.replayed} replayed answers, want {replayed}")
    if problems:
        raise BenchmarkFailure(f"{name}: " + "; ".join(problems))


def check_landed(name: str, landing: Path, url: str, expected: int) -> None:
    entries = list(landing.iterdir()) if landing.exists() else []
    files = [p for p in entries if p.suffix == ".ndjson" and not p.name.startswith(".")]
    leftovers = [p.name for p in entries if p.name.startswith(".")]
    with psycopg.connect(url) as conn:
        rows = dict(
            conn.execute(
                "SELECT status, count(*) FROM idem.ingest_ledger WHERE namespace = %s GROUP BY status",
                [NAMESPACE],
            ).fetchall()
        )
    problems = []
    if len(files) != expected:
        problems.append(f"{len(files)} files in {landing}, want {expected}")
    if leftovers:
        problems.append(f"{len(leftovers)} spool files left behind, e.g. {leftovers[0]}")
    if rows != {"committed": expected}:
        problems.append(f"ledger rows under {NAMESPACE}: {rows}, want {{'committed': {expected}}}")
    if problems:
        raise BenchmarkFailure(f"{name}: " + "; ".join(problems))


def figures(result: LoadResult, cpu: dict[str, float | None]) -> dict[str, float | None]:
    count = len(result.latencies)
    per_request = {
        f"{who}_cpu_ms_per_req": None if seconds is None else seconds / count * 1000
        for who, seconds in cpu.items()
    }
    return {
        "rps": result.requests_per_second,
        "p50_ms": statistics.median(result.latencies) * 1000,
        "p99_ms": result.percentile(0.99) * 1000,
        "max_ms": max(result.latencies) * 1000,
        "seconds": result.seconds,
        **per_request,
    }


def one_round(args: argparse.Namespace, server_url: str, directory: Path) -> dict[str, Any]:
    url = fresh_database(server_url, DATABASE)
    config_path = write_config(directory)
    landing = load_config(config_path).connector(CONNECTOR).path
    assert landing is not None
    env = environment(url, directory / "dagster_home", "local[1]")
    env.update({"IDEM_CONFIG": str(config_path), "IDEM_HTTP_TOKEN": ""})
    server = Server(config_path, env, directory / "serve.stderr")
    out: dict[str, Any] = {}
    try:
        out["startup_s"], out["banner_s"] = server.wait_healthy()
        load_args = {
            "requests": args.requests,
            "keys": args.keys,
            "clients": args.clients,
            "records_per_body": args.records_per_body,
        }
        load, cpu = measured(
            server, lambda: run_load(server.url, CONNECTOR, **load_args)
        )
        check_answers("load", load, args.requests, args.keys, None)
        out["load"] = {
            **figures(load, cpu),
            "conflicts_retried": load.conflicts_retried,
            "replayed": load.replayed,
        }
        replay, cpu = measured(
            server, lambda: run_load(server.url, CONNECTOR, **load_args)
        )
        check_answers("replay", replay, args.requests, args.keys, args.requests)
        if replay.file_keys != load.file_keys:
            raise BenchmarkFailure("replay: the replayed file keys differ from the first answers")
        out["replay"] = {
            **figures(replay, cpu),
            "conflicts_retried": replay.conflicts_retried,
        }
        check_landed("after the loads", landing, url, args.keys)
        if args.sequential:
            alone, cpu = measured(
                server,
                lambda: sequential(server.url, args.sequential, args.keys, args.records_per_body),
            )
            check_answers("sequential", alone, args.sequential, args.sequential, 0)
            out["sequential"] = figures(alone, cpu)
            check_landed("after the sequential pushes", landing, url, args.keys + args.sequential)
        out["server_rss_mib"] = server.ps.memory_info().rss / 2**20
    finally:
        out["shutdown_s"] = server.stop()
    return out


def machine(server_url: str) -> dict[str, Any]:
    with psycopg.connect(server_url) as conn:
        settings = {
            name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    ) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "os": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "postgres": settings,
    }


ROWS = [
    ("startup to /healthz (s)", ("startup_s",), "{:.2f}"),
    ("  of which to banner (s)", ("banner_s",), "{:.2f}"),
    ("load requests/s", ("load", "rps"), "{:,.0f}"),
    ("load p50 (ms)", ("load", "p50_ms"), "{:.1f}"),
    ("load p99 (ms)", ("load", "p99_ms"), "{:.1f}"),
    ("load 409s retried", ("load", "conflicts_retried"), "{:.0f}"),
    ("load server CPU ms/req", ("load", "server_cpu_ms_per_req"), "{:.2f}"),
    ("load client CPU ms/req", ("load", "client_cpu_ms_per_req"), "{:.2f}"),
    ("load PostgreSQL CPU ms/req", ("load", "postgres_cpu_ms_per_req"), "{:.2f}"),
    ("replay requests/s", ("replay", "rps"), "{:,.0f}"),
    ("replay p50 (ms)", ("replay", "p50_ms"), "{:.1f}"),
    ("replay p99 (ms)", ("replay", "p99_ms"), "{:.1f}"),
    ("replay server CPU ms/req", ("replay", "server_cpu_ms_per_req"), "{:.2f}"),
    ("replay client CPU ms/req", ("replay", "client_cpu_ms_per_req"), "{:.2f}"),
    ("replay PostgreSQL CPU ms/req", ("replay", "postgres_cpu_ms_per_req"), "{:.2f}"),
    ("sequential requests/s", ("sequential", "rps"), "{:,.0f}"),
    ("sequential p50 (ms)", ("sequential", "p50_ms"), "{:.2f}"),
    ("sequential p99 (ms)", ("sequential", "p99_ms"), "{:.2f}"),
    ("sequential server CPU ms/req", ("sequential", "server_cpu_ms_per_req"), "{:.2f}"),
    ("sequential client CPU ms/req", ("sequential", "client_cpu_ms_per_req"), "{:.2f}"),
    ("sequential PostgreSQL CPU ms/req", ("sequential", "postgres_cpu_ms_per_req"), "{:.2f}"),
    ("shutdown after SIGTERM (s)", ("shutdown_s",), "{:.2f}"),
    ("server RSS at end (MiB)", ("server_rss_mib",), "{:.0f}"),
]


def pick(result: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = result
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return None if value is None else float(value)


def parse_args() -> argparse.Namespace:
    """The command line: the server, the load's shape and the rounds; a load with fewer
    requests than keys could not send every key once, so it is refused here."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres", default=LOCAL_SERVER, help=f"server URL (default {LOCAL_SERVER})"
    )
    parser.add_argument("--requests", type=int, default=2000, help="POSTs per load")
    parser.add_argument("--keys", type=int, default=200, help="distinct idempotency keys per load")
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads")
    parser.add_argument("--records-per-body", type=int, default=5)
    parser.add_argument(
        "--sequential", type=int, default=200, help="fresh pushes from one client (0: skip)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument(
        "--workdir", help="configs, landing dirs, logs (default: a temp dir, removed)"
    )
    args = parser.parse_args()
    if args.keys < 1 or args.requests < args.keys:
        parser.error("--requests must be at least --keys, and --keys at least 1")
    return args


def print_round(index: int, result: dict[str, Any]) -> None:
    """One line per round as it ends: progress on a long run, and the spread at a glance."""
    print(
        f"round {index + 1}: startup {result['startup_s']:.2f} s, "
        f"load {result['load']['rps']:,.0f}/s p99 {result['load']['p99_ms']:.1f} ms, "
        f"replay {result['replay']['rps']:,.0f}/s p99 {result['replay']['p99_ms']:.1f} ms"
        + (
            f", sequential {result['sequential']['rps']:,.0f}/s "
            f"p50 {result['sequential']['p50_ms']:.2f} ms"
            if "sequential" in result
            else ""
        ),
        flush=True,
    )


def run_rounds(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]] | None:
    """``--repeat`` rounds, each in its own directory under ``workdir``; the scratch database
    is dropped whatever happened. None if a round failed (said on stderr, its files kept)."""
    rounds: list[dict[str, Any]] = []
    try:
        for index in range(args.repeat):
            directory = workdir / f"round-{index + 1}"
            shutil.rmtree(directory, ignore_errors=True)
            result = one_round(args, args.postgres, directory)
            rounds.append(result)
            print_round(index, result)
    except BenchmarkFailure as exc:
        print(f"push_bench: FAILED in round {len(rounds) + 1}: {exc}", file=sys.stderr)
        print(f"push_bench: the round's files are kept in {workdir}", file=sys.stderr)
        return None
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
            )
    return rounds


def print_setup(args: argparse.Namespace, facts: dict[str, Any]) -> None:
    """What was measured and on what: the figures mean little without the load's shape, the
    machine and PostgreSQL's durability settings."""
    pg = facts["postgres"]
    print(
        f"requests: {args.requests:,} over {args.keys:,} keys, {args.clients} clients, "
        f"{args.records_per_body} records/body; sequential: {args.sequential}; "
        f"rounds: {args.repeat} (median shown)"
    )
    print(
        f"machine: {facts['cores']} cores ({facts['cpu']}), {facts['memory_gib']} GiB, "
        f"load average at start {facts['load_average_at_start']}; PostgreSQL {pg['server_version']} "
        f"synchronous_commit={pg['synchronous_commit']} fsync={pg['fsync']}"
    )


def print_table(
    rounds: list[dict[str, Any]],
) -> tuple[dict[str, float], dict[str, list[float | None]]]:
    """The ``ROWS`` figures, median beside each round's; a figure no round has (no sequential
    pushes, a remote PostgreSQL's CPU) is left out. Returns the medians and per-round values,
    keyed by the figure's dotted path, for the JSON."""
    header = f"{'figure':32} {'median':>9}  " + "  ".join(
        f"{'round ' + str(i + 1):>9}" for i in range(len(rounds))
    )
    print(header)
    medians: dict[str, float] = {}
    per_round: dict[str, list[float | None]] = {}
    for label, path, fmt in ROWS:
        values = [pick(r, path) for r in rounds]
        present = [v for v in values if v is not None]
        if not present:
            continue
        key = ".".join(path)
        medians[key] = statistics.median(present)
        per_round[key] = values
        cells = "  ".join(f"{fmt.format(v) if v is not None else '-':>9}" for v in values)
        print(f"{label:32} {fmt.format(medians[key]):>9}  {cells}")
    return medians, per_round


def main() -> int:
    """Measure the machine first (its load average before we add ours), run the rounds, then
    report: the setup, the table, and every figure as one JSON line for tools."""
    args = parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="idem-push-bench-")).resolve()
    facts = machine(args.postgres)
    rounds = run_rounds(args, workdir)
    if rounds is None:
        return 1
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)

    print_setup(args, facts)
    medians, per_round = print_table(rounds)
    print(
        json.dumps(
            {
                "benchmark": "push",
                "requests": args.requests,
                "keys": args.keys,
                "clients": args.clients,
                "records_per_body": args.records_per_body,
                "sequential": args.sequential,
                "rounds": args.repeat,
                "machine": facts,
                "median": {k: round(v, 4) for k, v in medians.items()},
                "per_round": {
                    k: [None if v is None else round(v, 4) for v in values]
                    for k, values in per_round.items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
