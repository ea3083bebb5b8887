"""The idempotency ledger's own speed: ``begin`` + ``commit`` pairs per second on one connection.

    python benchmarks/ledger_bench.py [--postgres URL] [--pairs 5000] [--batch 100] [--repeat 3]

On a scratch database (``idem_ledger_bench``, created fresh with the idem schema,
dropped at the end), one connection, a new key per pair, the ledger emptied
before each round:

* ``baseline: SELECT 1``: one round trip, per second: the floor everything else is
  a few of (a pair is BEGIN, INSERT, UPDATE, COMMIT);
* ``ledger, 1 tx per pair``: ``BEGIN; begin(); commit(); COMMIT`` — what a caller
  pays per idempotent operation when each is its own transaction (one WAL flush each);
* ``ledger, N pairs per tx``: the same pairs, ``--batch`` of them per transaction
  (the flush is shared: the ledger's SQL cost on its own);
* ``run_idempotently, fresh``: the library call on an idle connection (it opens and
  commits its transaction; lock_timeout guard, handler savepoint, a trivial handler);
* ``run_idempotently, replay``: the same keys again: stored results returned.

Default PostgreSQL is the product's embedded default (pgserver under
benchmarks/data/.idem); ``--postgres`` takes a server URL. Prints the median of the
rounds as a table, then one JSON object with every figure and the server's
durability settings (they decide the one-tx-per-pair figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from benchmarks.harness import embedded_server, fresh_database  # noqa: E402
from idem_platform.idempotency import Ledger, run_idempotently  # noqa: E402
from idem_platform.postgres import connect, ensure_schema  # noqa: E402

DATABASE = "idem_ledger_bench"
NAMESPACE = "bench.ledger"


def request(i: int) -> dict[str, Any]:
    """A small request, like an order: what gets hashed per ``begin``."""
    return {"order_id": f"o-{i}", "cents": 500 + i, "currency": "EUR"}


def pairs_per_transaction(conn: psycopg.Connection, prefix: str, pairs: int, batch: int) -> None:
    ledger = Ledger(conn, NAMESPACE)
    for start in range(0, pairs, batch):
        with conn.transaction():
            for i in range(start, min(start + batch, pairs)):
                key = f"{prefix}-{i}"
                ledger.begin(key, request(i))
                ledger.commit(key, {"charge_id": f"ch-{i}"})


def round_trips(conn: psycopg.Connection, count: int) -> None:
    """The floor: one statement, one round trip (a pair costs 4, run_idempotently 8 fresh)."""
    for _ in range(count):
        conn.execute("SELECT 1").fetchone()
    conn.rollback()


def library_calls(conn: psycopg.Connection, prefix: str, pairs: int) -> None:
    for i in range(pairs):
        run_idempotently(
            conn, NAMESPACE, f"{prefix}-{i}", request(i), lambda i=i: {"charge_id": f"ch-{i}"}
        )


def timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def server_settings(conn: psycopg.Connection) -> dict[str, str]:
    names = ["server_version", "synchronous_commit", "fsync", "wal_sync_method"]
    return {
        name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0] for name in names
    }


def parse_args() -> argparse.Namespace:
    """The command line: how many pairs, how batched, how many rounds, which server."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres", help="server URL (default: the embedded pgserver)")
    parser.add_argument(
        "--pairs", type=int, default=5000, help="begin+commit pairs per variant and round"
    )
    parser.add_argument(
        "--batch", type=int, default=100, help="pairs per transaction in the batched variant"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data"))
    return parser.parse_args()


Variant = Callable[[psycopg.Connection, str], None]


def variants(pairs: int, batch: int) -> dict[str, Variant]:
    """What each round times, in order, by the name the table shows: each variant gets its own
    key prefix, except the library's two, where the second replays the first's keys."""
    return {
        "baseline: SELECT 1": lambda conn, p: round_trips(conn, pairs),
        "ledger, 1 tx per pair": lambda conn, p: pairs_per_transaction(conn, p, pairs, 1),
        f"ledger, {batch} pairs per tx": lambda conn, p: pairs_per_transaction(
            conn, p, pairs, batch
        ),
        "run_idempotently, fresh": lambda conn, p: library_calls(conn, "lib", pairs),
        "run_idempotently, replay": lambda conn, p: library_calls(conn, "lib", pairs),
    }


def run_rounds(
    url: str, timed_variants: dict[str, Variant], pairs: int, repeat: int
) -> tuple[dict[str, str], dict[str, list[float]], int]:
    """Every variant once per round on one connection, the ledger emptied before each round so
    the rounds start alike. Returns the server's settings, each variant's seconds per round and
    the ledger's rows after the last round (a check that the pairs were written)."""
    seconds: dict[str, list[float]] = {name: [] for name in timed_variants}
    with connect(url, application_name="idem-ledger-bench") as conn:
        settings = server_settings(conn)
        conn.rollback()
        for round_ in range(repeat):
            conn.execute("TRUNCATE idem.ingest_ledger")
            conn.commit()
            for index, (name, variant) in enumerate(timed_variants.items()):
                seconds[name].append(
                    timed(lambda variant=variant, index=index: variant(conn, f"v{index}"))
                )
            if repeat > 1:
                print(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{name} {pairs / s[-1]:,.0f}/s" for name, s in seconds.items()),
                    flush=True,
                )
        rows = conn.execute("SELECT count(*) FROM idem.ingest_ledger").fetchone()[0]
        conn.rollback()
    return settings, seconds, rows


def print_report(
    args: argparse.Namespace,
    settings: dict[str, str],
    seconds: dict[str, list[float]],
    rows: int,
) -> None:
    """The medians as a table for people, then every figure as one JSON line for tools."""
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        f"pairs: {args.pairs:,} per variant  rounds: {args.repeat} (median shown)  "
        f"postgres: {'server' if args.postgres else 'embedded'} {settings['server_version']}  "
        f"synchronous_commit={settings['synchronous_commit']} fsync={settings['fsync']}"
    )
    print(f"{'variant':28} {'pairs/s':>9} {'µs/pair':>8} {'seconds':>8}  (baseline: statements/s)")
    for name, value in medians.items():
        print(f"{name:28} {args.pairs / value:9,.0f} {value / args.pairs * 1e6:8.0f} {value:8.2f}")
    print(
        json.dumps(
            {
                "pairs": args.pairs,
                "batch": args.batch,
                "rounds": args.repeat,
                "ledger_rows_last_round": rows,
                "server": settings,
                "pairs_per_second": {
                    name: round(args.pairs / value, 1) for name, value in medians.items()
                },
                "seconds_per_round": {
                    name: [round(s, 4) for s in values] for name, values in seconds.items()
                },
            }
        )
    )


def main() -> int:
    """Make the scratch database, time the rounds, drop it (whatever happened), then report."""
    args = parse_args()
    server = args.postgres or embedded_server(Path(args.workdir).resolve() / ".idem")
    url = fresh_database(server, DATABASE)
    with connect(url, autocommit=True) as admin:
        ensure_schema(admin)
    try:
        settings, seconds, rows = run_rounds(
            url, variants(args.pairs, args.batch), args.pairs, args.repeat
        )
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
            )
    print_report(args, settings, seconds, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
