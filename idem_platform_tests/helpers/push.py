"""The push connectors' test config and what their server lands on disk."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from idem_platform.config import IdemConfig
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG


def push_config(directory: Path, **http: Any) -> IdemConfig:
    """The example's tables with an http connector ``push`` and an otlp connector ``otel``."""
    example = yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    example["connectors"] = [
        {"name": "push", "kind": "http", "path": "drop/push", "record_type_field": "type", "id_field": "id", **http},
        {"name": "otel", "kind": "otlp", "path": "drop/otel"},
    ]
    return write_config(directory, yaml.safe_dump(example, sort_keys=False))


def landed_files(config: IdemConfig, name: str = "push") -> list[Path]:
    """The files the server landed in connector ``name``'s directory, sorted (none yet: [])."""
    directory = config.connector(name).path
    assert directory is not None
    return sorted(p for p in directory.iterdir()) if directory.exists() else []


def wait_until_serving(process: subprocess.Popen[Any], port: int, *, poll: float) -> None:
    """Until the ``idem serve`` child ``process`` answers ``/healthz`` on ``port``, asked every
    ``poll`` seconds; fails the test if it exits or has not answered within 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "idem serve did not start"
        time.sleep(poll)
