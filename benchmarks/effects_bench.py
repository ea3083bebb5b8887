"""Outbound effects: how fast the outbox drains to a receiver, and what effects cost the ingest.

    python benchmarks/effects_bench.py [--postgres URL] [--records 200000] [--qualifying 10000]
                                       [--repeat 3] [--master local[2]] [--out FILE] [--workdir DIR]

Each round, on fresh scratch databases of the server:

* ``ingest off`` / ``ingest on``: ``idem ingest`` (a child process, as a user runs it: the
  interpreter, Dagster, a Spark JVM, the commit) of the same seeded file of ``--records``
  indicators with unique ids, ``--qualifying`` of them with confidence >= 80; once with a
  config without effects, once with the effect ``alert`` (confidence >= 80, an HTTP POST).
  The ``on`` run's commit writes ``--qualifying`` outbox rows (checked).
* ``1 dispatcher`` / ``2 dispatchers``: the outbox rows the ``on`` commit wrote are made due
  at once as if just committed (``created_at = next_attempt_at = now()``, nothing claimed or
  delivered), then one or two ``idem effects deliver`` child processes send them all to a
  receiver on loopback (a ``ThreadingHTTPServer`` in this process answering ``200`` at once,
  ``TCP_NODELAY`` like a production server).
  Every row must end ``delivered`` after exactly one attempt, and the receiver must have seen
  each key once (checked). ``deliveries/s`` is the rows over the span from the first claim
  to the last ``delivered_at`` (PostgreSQL's clock: interpreter start excluded);
  ``latency`` is ``delivered_at - created_at`` per row: in a burst it is mostly the wait in
  line behind the rows before it (plus the dispatchers' start), not one request's time.

Prints each round, the median of the rounds as a table, and one JSON object last (also
written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import environment, fresh_database, run_ingest  # noqa: E402
from idem_platform.samples import write_lines  # noqa: E402

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASES = ("idem_effects_bench_off", "idem_effects_bench_on")


class BenchmarkFailure(Exception):
    """A round was not exactly once: the figures would mean nothing."""


@contextmanager
def receiver() -> Iterator[tuple[str, Counter[str]]]:
    """A loopback receiver answering 200 at once; its URL and the keys it saw (with counts).

    Its sockets are ``TCP_NODELAY``, as production HTTP servers' are (nginx, Go's net/http,
    uvicorn): ``http.server`` writes a response's headers and body in two sends, and with
    Nagle's algorithm on, the body of an answer on a kept-alive connection would wait for
    the client's delayed ACK of the headers (40 ms on Linux loopback), a stall no real
    receiver has.
    """
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                seen[self.headers.get("Idempotency-Key") or ""] += 1
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", seen
    finally:
        server.shutdown()
        server.server_close()


def write_config(directory: Path, url: str | None) -> Path:
    """idem.yaml: a file drop of indicators; with ``url``, the effect ``alert`` posting to it."""
    data: dict[str, Any] = {
        "connectors": [{"name": "threatfeed", "kind": "filedrop", "path": "drop", "record_type_field": "type",
                        "id_field": "id"}],
        "tables": {"indicator": {"columns": {"name": {"type": "string", "required": True}, "confidence": "int"}}},
    }
    if url:
        data["effects"] = [{
            "name": "alert", "record_type": "indicator", "when": {"field": "confidence", "gte": 80},
            "http": {"url": url, "body": {"indicator": "name", "confidence": "confidence", "id": "external_id"}},
            "lease_seconds": 60,
        }]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "idem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def data_file(directory: Path, records: int, qualifying: int) -> Path:
    """``records`` indicators with unique ids; every (records // qualifying)-th one qualifies."""
    step = max(records // max(qualifying, 1), 1)
    lines = (
        json.dumps({"type": "indicator", "id": f"ioc-{i}", "name": f"host{i}.example",
                    "confidence": 90 if i % step == 0 and i // step < qualifying else i % 80})
        for i in range(records)
    )
    return write_lines(directory / f"indicators-{records}-{qualifying}.ndjson", list(lines))


def ingest(name: str, server: str, database: str, config: Path, data: Path, records: int,
           home: Path, master: str) -> tuple[str, dict[str, Any]]:
    """One measured ``idem ingest`` of ``data`` into a fresh ``database``: its URL and figures."""
    url = fresh_database(server, database)
    env = environment(url, home, master)
    drop = config.parent / "drop"
    drop.mkdir(exist_ok=True)
    target = drop / data.name
    shutil.copyfile(data, target)
    phase = run_ingest(name, target, records, env, config)
    if phase.summary.get("rows_written") != records:
        raise BenchmarkFailure(f"{name}: wrote {phase.summary.get('rows_written')} rows, not {records}")
    return url, {"wall_s": round(phase.wall, 3), "rows_per_s": round(phase.rows_per_second, 1),
                 "effects_created": phase.summary.get("effects_created", 0)}


def dispatch(url: str, config: Path, dispatchers: int, seen: Counter[str], home: Path, master: str) -> dict[str, Any]:
    """Make every outbox row due as if just committed, drain it with ``dispatchers`` children."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE idem.outbox SET status = 'pending', attempts = 0, claimed_by = NULL, claimed_until = NULL, "
            "delivered_at = NULL, last_attempt_at = NULL, last_status = NULL, last_response = NULL, "
            "created_at = now(), next_attempt_at = now()"
        )
    seen.clear()
    env = {**environment(url, home, master), "IDEM_CONFIG": str(config)}
    started = time.monotonic()
    children = [
        subprocess.Popen([sys.executable, "-m", "idem_platform.cli", "effects", "deliver"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(dispatchers)
    ]
    for child in children:
        _, err = child.communicate()
        if child.returncode != 0:
            raise BenchmarkFailure(f"idem effects deliver failed:\n{err[-2000:]}")
    wall = time.monotonic() - started
    with psycopg.connect(url) as conn:
        figures = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'delivered'), count(*) FILTER (WHERE attempts = 1), "
            "extract(epoch FROM max(delivered_at) - min(last_attempt_at)) FROM idem.outbox"
        ).fetchone()
        assert figures is not None  # noqa: S101 - an aggregate always answers one row
        count, delivered, once, span = figures
        latencies = [float(v) for (v,) in conn.execute(
            "SELECT extract(epoch FROM delivered_at - created_at) FROM idem.outbox ORDER BY 1"
        ).fetchall()]
    if not count == delivered == once == len(seen) or set(seen.values()) != {1}:
        raise BenchmarkFailure(f"{dispatchers} dispatcher(s): {count} rows, {delivered} delivered, "
                               f"{once} in one attempt, {len(seen)} keys received, max {max(seen.values(), default=0)}x")
    return {
        "deliveries": count, "wall_s": round(wall, 3), "deliveries_per_s": round(count / float(span), 1),
        "latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
        "latency_p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 1),
    }


def one_round(args: argparse.Namespace, directory: Path, data: Path, url: str, seen: Counter[str]) -> dict[str, Any]:
    """Ingest off, ingest on, then drain the on-run's outbox with one, then two dispatchers."""
    home = directory / "dagster_home"
    off_config = write_config(directory / "off", None)
    on_config = write_config(directory / "on", url)
    _, off = ingest("ingest off", args.postgres, DATABASES[0], off_config, data, args.records, home, args.master)
    on_url, on = ingest("ingest on", args.postgres, DATABASES[1], on_config, data, args.records, home, args.master)
    if on["effects_created"] != args.qualifying:
        raise BenchmarkFailure(f"ingest on created {on['effects_created']} effects, not {args.qualifying}")
    result = {"ingest_off": off, "ingest_on": on}
    for dispatchers in (1, 2):
        result[f"dispatchers_{dispatchers}"] = dispatch(on_url, on_config, dispatchers, seen, home, args.master)
    return result


ROWS = [
    ("ingest, effects off (rows/s)", ("ingest_off", "rows_per_s"), "{:,.0f}"),
    ("ingest, effects on (rows/s)", ("ingest_on", "rows_per_s"), "{:,.0f}"),
    ("ingest, effects off (s)", ("ingest_off", "wall_s"), "{:.2f}"),
    ("ingest, effects on (s)", ("ingest_on", "wall_s"), "{:.2f}"),
    ("1 dispatcher: deliveries/s", ("dispatchers_1", "deliveries_per_s"), "{:,.0f}"),
    ("1 dispatcher: latency p50 (ms)", ("dispatchers_1", "latency_p50_ms"), "{:,.0f}"),
    ("1 dispatcher: latency p99 (ms)", ("dispatchers_1", "latency_p99_ms"), "{:,.0f}"),
    ("2 dispatchers: deliveries/s", ("dispatchers_2", "deliveries_per_s"), "{:,.0f}"),
    ("2 dispatchers: latency p50 (ms)", ("dispatchers_2", "latency_p50_ms"), "{:,.0f}"),
    ("2 dispatchers: latency p99 (ms)", ("dispatchers_2", "latency_p99_ms"), "{:,.0f}"),
]


def table(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Print the median of the rounds beside each round; the medians."""
    print(f"{'figure':34} {'median':>9}  " + "  ".join(f"{'round ' + str(i + 1):>9}" for i in range(len(rounds))))
    medians: dict[str, float] = {}
    for label, (phase, figure), fmt in ROWS:
        values = [float(r[phase][figure]) for r in rounds]
        medians[f"{phase}.{figure}"] = statistics.median(values)
        cells = "  ".join(f"{fmt.format(v):>9}" for v in values)
        print(f"{label:34} {fmt.format(medians[f'{phase}.{figure}']):>9}  {cells}")
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default=LOCAL_SERVER, help=f"server URL (default {LOCAL_SERVER})")
    parser.add_argument("--records", type=int, default=200_000, help="indicators in the ingested file")
    parser.add_argument("--qualifying", type=int, default=10_000, help="of them with confidence >= 80: the effects")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument("--master", default="local[2]", help="Spark master of the ingests")
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--workdir", help="configs, data, Dagster home (default: a temp dir, removed)")
    args = parser.parse_args()
    if not 0 < args.qualifying <= args.records:
        parser.error("--qualifying must be between 1 and --records")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="idem-effects-bench-")).resolve()
    load = [round(x, 2) for x in os.getloadavg()]
    rounds: list[dict[str, Any]] = []
    try:
        data = data_file(workdir, args.records, args.qualifying)
        with receiver() as (url, seen):
            for index in range(args.repeat):
                directory = workdir / f"round-{index + 1}"
                shutil.rmtree(directory, ignore_errors=True)
                rounds.append(one_round(args, directory, data, url, seen))
                r = rounds[-1]
                print(f"round {index + 1}: ingest off {r['ingest_off']['rows_per_s']:,.0f} rows/s, "
                      f"on {r['ingest_on']['rows_per_s']:,.0f} rows/s; 1 dispatcher "
                      f"{r['dispatchers_1']['deliveries_per_s']:,.0f}/s, 2 dispatchers "
                      f"{r['dispatchers_2']['deliveries_per_s']:,.0f}/s", flush=True)
    except BenchmarkFailure as exc:
        print(f"effects_bench: FAILED in round {len(rounds) + 1}: {exc}", file=sys.stderr)
        return 1
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            for name in DATABASES:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"records: {args.records:,}, qualifying (effects): {args.qualifying:,}; rounds: {args.repeat} (median shown); "
          f"{os.cpu_count()} cores, load average at start {load}")
    medians = table(rounds)
    result = {"benchmark": "effects", "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "records": args.records, "qualifying": args.qualifying, "cores": os.cpu_count(),
              "load_average_at_start": load, "median": medians, "rounds": rounds}
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
