"""The child side of idempotency/test_call's 16-process race, in a module of its own.

Spawned children import only this (psycopg and the ledger), not the test
module and its conftest, so sixteen of them start quickly on a small machine.
"""

from __future__ import annotations

import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

KEY = "the-one-key"
REQUEST = {"order": "o-1", "cents": 500}
HOLD_SECONDS = 0.3


def race(
    url: str, namespaces: tuple[str, str], index: int, barrier: Barrier, results: Queue
) -> None:
    """Race the others twice: ``Ledger.begin`` on one key, then ``run_idempotently`` on another.

    Each race starts at a barrier, so all sixteen ask at once. The winner holds
    its claim for :data:`HOLD_SECONDS` before committing, long enough that the
    others are blocked on it rather than arriving after.
    """
    from idem_platform.idempotency import run_idempotently
    from idem_platform.ledger import Fresh, Ledger
    from idem_platform.postgres import connect

    owner = f"p{index}"
    with connect(url) as conn:
        barrier.wait(timeout=120)
        with conn.transaction():
            ledger = Ledger(conn, namespaces[0])
            outcome = ledger.begin(KEY, REQUEST, owner=owner)
            if isinstance(outcome, Fresh):
                time.sleep(HOLD_SECONDS)
                ledger.commit(KEY, {"winner": index}, owner=owner)
        results.put(("begin", index, type(outcome).__name__, getattr(outcome, "result", None)))

        def handler() -> dict[str, Any]:
            conn.execute("INSERT INTO public.race_runs (runner) VALUES (%s)", [index])
            time.sleep(HOLD_SECONDS)
            return {"winner": index}

        barrier.wait(timeout=120)
        try:
            answer: Any = run_idempotently(
                conn, namespaces[1], KEY, REQUEST, handler, wait_seconds=60
            )
        except Exception as exc:  # reported, not raised: the parent asserts on it
            answer = repr(exc)
        results.put(("run", index, "answer", answer))
