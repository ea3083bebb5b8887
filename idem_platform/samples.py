"""Seeded threat-feed records for the demo and the benchmark.

Three record types (indicator, malware, threat-actor) with ~10 fields each,
including a vector(8), a nested dynamic object and timestamps in both RFC 3339
and epoch-nanosecond form. A share of lines repeat an earlier record exactly
(same key: an in-batch duplicate) and, on request, a share are broken in the
ways real feeds break (not JSON, wrong types, out-of-range values).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

TYPES = ("indicator", "malware", "threat-actor")
_BAD_LINES = (
    "this is not json",
    '{"type": "indicator", "id": "bad-1", "name": "x", "confidence": 3000000000}',
    '{"type": "indicator", "id": "bad-2", "name": "x", "embedding": [1, 2, 3]}',
    '{"type": "malware", "id": "bad-3", "first_seen": "yesterday", "name": "x"}',
    '["an", "array"]',
    '{"type": "unknown-type", "id": "bad-4"}',
)


def _record(rng: random.Random, index: int) -> dict[str, object]:
    kind = TYPES[index % 3]
    second = 1_767_225_600 + rng.randrange(0, 30 * 86400)  # January 2026
    stamp = f"2026-01-{1 + (second // 86400) % 28:02d}T{(second // 3600) % 24:02d}:{(second // 60) % 60:02d}:{second % 60:02d}Z"
    if kind == "indicator":
        return {
            "type": kind,
            "id": f"ioc-{index}",
            "name": f"host-{rng.randrange(10**9)}.bad.example",
            "confidence": rng.randrange(0, 101),
            "score": round(rng.random(), 6),
            "created": stamp,
            "embedding": [round(rng.uniform(-1, 1), 5) for _ in range(8)],
            "tags": {"kill_chain": rng.sample(["recon", "weaponize", "deliver", "exploit", "c2"], 2), "tlp": "amber"},
            "active": rng.random() < 0.8,
            "source": "osint",
        }
    if kind == "malware":
        return {
            "type": kind,
            "id": f"mw-{index}",
            "name": rng.choice(["emotet", "trickbot", "qakbot", "lokibot"]) + f"-{index}",
            "family": rng.choice(["banker", "loader", "stealer"]),
            "first_seen": second * 1_000_000_000 + rng.randrange(1_000_000_000),
            "sample_size": rng.randrange(10_000, 50_000_000_000),
            "is_packed": rng.random() < 0.5,
            "labels": {"av": {"detections": rng.randrange(70), "engines": 70}, "yara": ["rule_a", "rule_b"]},
            "score": round(rng.random(), 4),
            "platform": "windows",
        }
    return {
        "type": kind,
        "id": f"ta-{index}",
        "name": f"APT-{rng.randrange(100)} é",
        "aliases": [f"alias-{rng.randrange(1000)}" for _ in range(rng.randrange(1, 4))],
        "sophistication": rng.randrange(1, 6),
        "score": round(rng.random() * 10, 3),
        "last_seen": stamp,
        "observed_count": rng.randrange(1, 10**6),
        "motivation": rng.choice(["financial", "espionage"]),
        "country": rng.choice(["XX", "YY", "ZZ"]),
    }


def threatfeed_lines(
    count: int, *, seed: int = 7, duplicate_ratio: float = 0.10, bad_ratio: float = 0.0, start: int = 0
) -> Iterator[str]:
    """``count`` NDJSON lines; ``duplicate_ratio`` of them repeat an earlier line exactly."""
    rng = random.Random(seed)
    recent: list[str] = []
    index = start
    for _ in range(count):
        roll = rng.random()
        if roll < bad_ratio:
            yield rng.choice(_BAD_LINES)
            continue
        if recent and roll < bad_ratio + duplicate_ratio:
            yield rng.choice(recent)
            continue
        line = json.dumps(_record(rng, index), ensure_ascii=False)
        index += 1
        recent.append(line)
        if len(recent) > 1000:
            recent.pop(0)
        yield line


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    """Write NDJSON lines to ``path`` atomically (a dotfile renamed into place, as droppers should)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line)
            handle.write("\n")
    temporary.replace(path)
    return path


def write_threatfeed(path: Path, count: int, **options: Any) -> Path:
    """Write ``count`` generated lines to ``path`` atomically."""
    return write_lines(path, threatfeed_lines(count, **options))
