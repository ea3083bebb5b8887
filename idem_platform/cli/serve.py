"""``idem serve``: the HTTP push API of the config's ``http`` and ``otlp`` connectors.

The server (FastAPI, uvicorn) is imported when the command runs: ``idem --help`` stays fast.
"""

from __future__ import annotations

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import IdemCommand, invocation
from idem_platform.cli.output import CommandError
from idem_platform.config import IdemConfig, load_config

PUSH_KINDS = ("http", "otlp")


@click.command("serve", cls=IdemCommand, short_help="The HTTP and OTLP push API.")
@click.option("--host", default="127.0.0.1", show_default=True, help="without IDEM_HTTP_TOKEN: loopback only")
@click.option("--port", type=int, default=8787, show_default=True)
@click.option("--max-body-bytes", type=int, help="override every connector's max_body_bytes")
def serve(host: str, port: int, max_body_bytes: int | None) -> None:
    """HTTP push API for http/otlp connectors: NDJSON with idempotency keys, OTLP logs."""
    # Late import (pulls in FastAPI and uvicorn): kept off idem --help's imports.
    from idem_platform.sources.push.server import serve as serve_forever
    from idem_platform.sources.push.server import settings_from_environment

    config = load_config(invocation().config)
    if not any(c.kind in PUSH_KINDS for c in config.connectors):
        raise CommandError(
            "idem serve needs an http or otlp connector in the config (kind: http | otlp, with the "
            "path its bodies land in)"
        )
    url = prepare_environment()
    settings = settings_from_environment(config, url)
    if max_body_bytes is not None:
        settings.config = with_max_body_bytes(config, max_body_bytes)
    serve_forever(settings, host, port)


def with_max_body_bytes(config: IdemConfig, max_body_bytes: int) -> IdemConfig:
    """``config`` with every push connector's ``max_body_bytes`` set to ``max_body_bytes``."""
    connectors = [
        c.model_copy(update={"max_body_bytes": max_body_bytes}) if c.kind in PUSH_KINDS else c
        for c in config.connectors
    ]
    return config.model_copy(update={"connectors": connectors})
