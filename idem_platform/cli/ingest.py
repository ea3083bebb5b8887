"""``idem ingest`` and ``idem demo``: a connector's files (or Kafka lag) committed in process,
by the very Dagster job the sensor launches, against the same instance.

The push server of the demo (FastAPI) is imported when the demo pushes: ``idem --help``
stays fast.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import click

from idem_platform.cli.common import choose_connector, prepare_environment, public_summary
from idem_platform.cli.options import IdemCommand, invocation, json_option
from idem_platform.cli.output import CommandError
from idem_platform.cli.runs import ingest_connector
from idem_platform.config import HttpConnector, IdemConfig, load_config
from idem_platform.redact import masked
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.settings import POSTGRES_URL_ENV, dagster_url_from_environment


@click.command("ingest", cls=IdemCommand, short_help="Ingest files or Kafka lag, exactly once.")
@click.option("--connector", metavar="NAME", help="which connector (default: the one whose directory holds the files, else the only one)")
@click.option("--replay", is_flag=True, help="tag the run as a replay (skips count as replay_skip)")
@click.option(
    "--dagster", "dagster_url", metavar="URL",
    help="launch the run through this Dagster webserver (e.g. http://localhost:3000) and wait for it "
    "[default: $IDEM_DAGSTER_URL; unset: run in this process]",
)
@json_option()
@click.argument("files", nargs=-1, metavar="[FILE]...")
def ingest(connector: str | None, replay: bool, dagster_url: str | None, files: tuple[str, ...]) -> dict[str, Any]:
    """Ingest a connector's files, or its Kafka lag, exactly once.

    FILE: a file-drop connector's files (none for a Kafka connector).

    The run is the connector's Dagster job, executed in this process; with --dagster,
    launched in the code location that defines it, as the UI launches runs.
    """
    started = time.monotonic()
    config = load_config(invocation().config)
    # A usage error is said before PostgreSQL is reached (or the embedded one started).
    name = choose_connector(config, connector, files)
    prepare_environment()
    summary = ingest_connector(config, name, files, replay=replay, dagster_url=dagster_url or dagster_url_from_environment())
    return public_summary(summary, time.monotonic() - started)


@click.command("demo", cls=IdemCommand)
@click.option("--records", type=int, default=5000, show_default=True, help="records per sample drop")
@json_option()
def demo(records: int) -> dict[str, Any]:
    """Write sample drops and ingest them (then replay one)."""
    started = time.monotonic()
    prepare_environment()
    config = load_config(invocation().config)
    connector = next((c for c in config.connectors if c.kind == "filedrop"), None)
    if connector is None or connector.path is None:
        raise CommandError("the demo needs a filedrop connector in the config")
    day = time.strftime("%Y-%m-%d")
    lines = list(threatfeed_lines(records, seed=1, bad_ratio=0.01))
    first = write_lines(connector.path / f"threatfeed-{day}-a.ndjson", lines)
    # The second drop re-sends the second half of the first (same records, same
    # keys: skipped) followed by as many new records (written).
    fresh = threatfeed_lines(records // 2, seed=2, start=10 * records)
    second = write_lines(connector.path / f"threatfeed-{day}-b.ndjson", [*lines[len(lines) // 2 :], *fresh])
    runs = [
        ingest_connector(config, connector.name, [str(first)]),
        ingest_connector(config, connector.name, [str(second)]),
        ingest_connector(config, connector.name, [str(first)]),
    ]
    totals = {k: sum(int(r[k]) for r in runs) for k in ("rows_written", "rows_skipped", "rows_rejected")}
    summary = {
        "commit_id": runs[-1]["commit_id"],
        **totals,
        "replayed": bool(runs[-1]["replayed"]),
        "files": [str(first), str(second)],
        "seconds": round(time.monotonic() - started, 3),
        "runs": [public_summary(r, float(r.get("seconds", 0))) for r in runs],
        "postgres": masked(os.environ[POSTGRES_URL_ENV]),
    }
    pusher = next((c for c in config.connectors if isinstance(c, HttpConnector)), None)
    if pusher is not None:
        summary["push"] = demo_push(config, pusher, [*lines[:2], *threatfeed_lines(2, seed=3, start=20 * records)])
        summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def demo_push(config: IdemConfig, connector: HttpConnector, lines: list[str]) -> dict[str, Any]:
    """One push through ``idem serve``'s API and its replay, then the landed file's ingest.

    The server runs in this process on a free loopback port; the requests are real HTTP.
    """
    # Late import (pulls in FastAPI and uvicorn): kept off idem --help's imports.
    from idem_platform.sources.push.server import serve_in_background, settings_from_environment

    if connector.path is None:
        raise CommandError(f"connector {connector.name!r} has no path to land pushed bodies in")
    body = "".join(line + "\n" for line in lines).encode()
    key = f"demo-push-{time.strftime('%Y-%m-%d')}"
    server = serve_in_background(settings_from_environment(config, os.environ[POSTGRES_URL_ENV]))
    answers = []
    try:
        for _ in range(2):
            request = urllib.request.Request(
                f"{server.url}/v1/connectors/{connector.name}/records",
                data=body,
                method="POST",
                headers={"Content-Type": "application/x-ndjson", "Idempotency-Key": key},
            )
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own loopback server
                answers.append({"status": response.status, **json.loads(response.read())})
    finally:
        server.stop()
    landed = connector.path / Path(answers[0]["path"]).name
    run = ingest_connector(config, connector.name, [str(landed)])
    return {
        "request": f"POST /v1/connectors/{connector.name}/records",
        "idempotency_key": key,
        "answers": answers,
        "run": public_summary(run, float(run.get("seconds", 0))),
    }
