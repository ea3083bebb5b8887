"""Where idem's own environment variables are named and read.

A process reads them when it needs them (never at import), through these functions,
so tests can set them with ``monkeypatch.setenv`` and no module caches a stale value.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "IDEM_HOME"
POSTGRES_URL_ENV = "IDEM_POSTGRES_URL"


def idem_home() -> Path:
    """``$IDEM_HOME`` or ``./.idem``: the embedded server, Dagster home and sample drops."""
    return Path(os.environ.get(HOME_ENV) or ".idem").resolve()


def postgres_url_from_environment() -> str | None:
    """``$IDEM_POSTGRES_URL``, when it is set and not blank."""
    return os.environ.get(POSTGRES_URL_ENV) or None
