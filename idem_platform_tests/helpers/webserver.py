"""A real ``dagster-webserver`` on a test's instance, asked through its GraphQL HTTP API.

What the UI shows is what the webserver's GraphQL API answers; Dagster's in-process
GraphQL test utilities are not public API, so the tests ask a real webserver
subprocess over HTTP (``POST /graphql``), as the UI does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from idem_platform_tests.helpers.kafka_broker import free_port

LOCATION = "idem_test"
_LOCATION_STATUS = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


class GraphQL:
    """The GraphQL endpoint of one webserver."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.base = url.removesuffix("/graphql")  # the webserver's own URL (what the UI opens)

    def query(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``data`` of the answer (an answer with ``errors`` fails the test)."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        assert not answer.get("errors"), answer["errors"]
        return dict(answer["data"])


def _definitions_file(tmp_path: Path, config_path: Path, postgres_url: str) -> Path:
    """A code location building the test's Definitions (the config and URL written in)."""
    path = tmp_path / "idem_test_location.py"
    path.write_text(
        "from idem_platform.config import load_config\n"
        "from idem_platform.defs.definitions import build_definitions\n\n"
        f"defs = build_definitions(load_config({str(config_path)!r}), postgres_url={postgres_url!r})\n"
    )
    workspace = tmp_path / "webserver_workspace.yaml"
    workspace.write_text(
        json.dumps({"load_from": [{"python_file": {"relative_path": str(path), "location_name": LOCATION}}]})
    )
    return workspace


def _wait_until_loaded(process: subprocess.Popen[bytes], api: GraphQL, log: Path) -> None:
    """Until the webserver answers and its code location is loaded (or it exits)."""
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, f"dagster-webserver exited: {log.read_text()[-3000:]}"
        try:
            entries = api.query(_LOCATION_STATUS)["workspaceOrError"]["locationEntries"]
            if [e["loadStatus"] for e in entries] == ["LOADED"]:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the webserver never loaded its code location: {log.read_text()[-3000:]}"
        time.sleep(0.25)


@contextmanager
def webserver(
    home: Path, tmp_path: Path, config_path: Path, postgres_url: str, *, daemon: bool = False
) -> Iterator[GraphQL]:
    """A ``dagster-webserver`` on the instance of ``home`` (its ``dagster.yaml``) with the
    test's Definitions as its one code location; stopped on exit.

    ``daemon``: also ``dagster-daemon run`` on the same workspace, which takes the runs the
    webserver queues (the instance's run coordinator is Dagster's default queue).
    """
    port = free_port()
    workspace = _definitions_file(tmp_path, config_path, postgres_url)
    log = tmp_path / "webserver.log"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    bin_dir = Path(sys.executable).parent
    commands = [[str(bin_dir / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)]]
    if daemon:
        commands.append([str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)])
    processes = []
    try:
        for command, name in zip(commands, ("webserver.log", "daemon.log"), strict=False):
            with (tmp_path / name).open("w") as output:
                processes.append(
                    subprocess.Popen(command, cwd=tmp_path, env=env, stdout=output, stderr=subprocess.STDOUT)
                )
        api = GraphQL(f"http://127.0.0.1:{port}/graphql")
        _wait_until_loaded(processes[0], api, log)
        yield api
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
