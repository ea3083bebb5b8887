"""idem.yaml with effects for the effects tests: the example's file drop plus an alert on
high-confidence indicators, sent to a loopback receiver, with short backoffs and leases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from idem_platform.config import IdemConfig
from idem_platform.postgres import connect
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.database import fresh_config


def alert(url: str, **overrides: Any) -> dict[str, Any]:
    """The ``alert`` effect: indicators with confidence >= 80, to ``url``, fast retries."""
    effect: dict[str, Any] = {
        "name": "alert",
        "record_type": "indicator",
        "when": {"field": "confidence", "gte": 80},
        "http": {
            "url": url,
            "headers": {"Authorization": "Bearer ${IDEM_TEST_EFFECT_TOKEN:-test-token}"},
            "body": {"indicator": "name", "confidence": "confidence", "id": "external_id"},
            "timeout_seconds": 2,
        },
        "max_attempts": 4,
        "backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "lease_seconds": 3,
    }
    http = overrides.pop("http", {})
    effect.update(overrides)
    effect["http"].update(http)
    return effect


def effects_config(directory: Path, pg_url: str, effects: list[dict[str, Any]], **top: Any) -> IdemConfig:
    """The example's file drop with ``effects`` (and the top-level keys ``top``, e.g.
    ``effect_modules``), written to ``directory/idem.yaml``, on an emptied database with its
    tables synced."""
    data = yaml.safe_load(example_text())
    data.update(top)
    data["effects"] = effects
    return fresh_config(directory, pg_url, yaml.safe_dump(data, sort_keys=False))


def outbox(pg_url: str) -> list[dict[str, Any]]:
    """Every outbox row (key, effect, status, attempts, payload, record_key, reason, last_status)."""
    names = ("key", "effect", "status", "attempts", "payload", "record_key", "reason", "last_status")
    with connect(pg_url) as conn:
        rows = conn.execute(f"SELECT {', '.join(names)} FROM idem.outbox ORDER BY record_key, effect").fetchall()
    return [dict(zip(names, row, strict=True)) for row in rows]


FUNCTION_MODULE = """
import json
import os


def enrich(payload, key):
    \"\"\"Acts by appending a line to the file IDEM_TEST_EFFECT_LOG names; fails on 'boom'.\"\"\"
    if payload.get("indicator") == "boom":
        raise RuntimeError("the enrichment service refused boom")
    with open(os.environ["IDEM_TEST_EFFECT_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"key": key, "payload": payload}) + "\\n")
    return {"score": len(payload.get("indicator") or ""), "key": key[:8]}
"""


def function_module(directory: Path, name: str) -> str:
    """Write the module ``name`` (its ``enrich`` function acts on a log file) beside the config."""
    (directory / f"{name}.py").write_text(FUNCTION_MODULE, encoding="utf-8")
    return name


def enrich(module: str, **overrides: Any) -> dict[str, Any]:
    """The ``enrich`` effect: indicators with confidence >= 80, to ``module:enrich``, fast retries."""
    effect: dict[str, Any] = {
        "name": "enrich",
        "record_type": "indicator",
        "when": {"field": "confidence", "gte": 80},
        "python": {"function": f"{module}:enrich", "body": {"indicator": "name", "id": "external_id"}},
        "max_attempts": 3,
        "backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "lease_seconds": 2,
    }
    effect.update(overrides)
    return effect
