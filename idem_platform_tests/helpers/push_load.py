"""A load of concurrent pushes with repeated keys: the push API's exactly-once test and benchmark.

``requests`` POSTs over ``keys`` keys from ``clients`` threads: every key once, the
rest random repeats, shuffled, so repeats race their first request. Each key has one
body (``records_per_body`` records), so every answer must be ``202``; a ``409`` (the
same key in flight) is retried after its ``Retry-After``, as a client would.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadResult:
    """What the load saw: statuses of final answers, retries, latencies (seconds)."""

    seconds: float
    statuses: Counter[int] = field(default_factory=Counter)
    conflicts_retried: int = 0
    latencies: list[float] = field(default_factory=list)
    file_keys: dict[str, set[str]] = field(default_factory=dict)
    replayed: int = 0

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "requests": len(self.latencies),
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(self.requests_per_second, 1),
            "p50_ms": round(statistics.median(self.latencies) * 1000, 2) if self.latencies else None,
            "p99_ms": round(self.percentile(0.99) * 1000, 2),
            "statuses": dict(self.statuses),
            "conflicts_retried": self.conflicts_retried,
            "replayed": self.replayed,
        }


def body_for(key: int, records_per_body: int) -> bytes:
    """The one body of key number ``key``."""
    return b"".join(
        json.dumps({"type": "indicator", "id": f"load-{key}-{j}", "name": f"host-{key}-{j}.example",
                    "confidence": (key + j) % 100}).encode() + b"\n"
        for j in range(records_per_body)
    )


def run_load(
    base_url: str,
    connector: str,
    *,
    requests: int = 2000,
    keys: int = 200,
    clients: int = 32,
    records_per_body: int = 5,
    seed: int = 7,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Send the load and return what came back."""
    rng = random.Random(seed)
    order = list(range(keys)) + [rng.randrange(keys) for _ in range(requests - keys)]
    rng.shuffle(order)
    bodies = {k: body_for(k, records_per_body) for k in range(keys)}
    result = LoadResult(seconds=0.0)
    lock = threading.Lock()
    local = threading.local()
    url = f"{base_url}/v1/connectors/{connector}/records"

    def send(key: int) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(timeout=60, headers=headers or {})
        started = time.perf_counter()
        retries = 0
        while True:
            answer = client.post(
                url,
                content=bodies[key],
                headers={"Content-Type": "application/x-ndjson", "Idempotency-Key": f"load-key-{key}"},
            )
            if answer.status_code != 409:
                break
            retries += 1
            time.sleep(float(answer.headers.get("Retry-After", "1")))
        elapsed = time.perf_counter() - started
        with lock:
            result.statuses[answer.status_code] += 1
            result.conflicts_retried += retries
            result.latencies.append(elapsed)
            if answer.status_code == 202:
                data = answer.json()
                result.file_keys.setdefault(f"load-key-{key}", set()).add(data["file_key"])
                result.replayed += bool(data["replayed"])

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, order))
    result.seconds = time.perf_counter() - started
    return result
