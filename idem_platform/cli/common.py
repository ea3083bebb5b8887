"""What several commands share: the process's environment (PostgreSQL, Dagster's home), the
connector a command acts on, and the public shape of a commit's summary.

Nothing here imports Dagster or Spark: ``idem rejects`` or ``idem ledger purge`` need
neither, and ``idem --help`` loads this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from idem_platform.cli.output import CommandError
from idem_platform.config import FileConnectorBase, IdemConfig
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.embedded import resolve_postgres_url
from idem_platform.postgres.schema import SCHEMA
from idem_platform.private_files import private_dir, write_private_text
from idem_platform.settings import POSTGRES_URL_ENV, idem_home

SUMMARY_KEYS = ("commit_id", "rows_written", "rows_skipped", "rows_rejected", "replayed", "files", "seconds")
_DETAIL_KEYS = (
    "tables", "schema_versions", "offsets", "sources", "consumer_group", "timings", "already_committed",
    "nothing_to_ingest", "notes", "connector", "spark", "run_id", "dagster",
)


def prepare_environment() -> str:
    """Resolve PostgreSQL (embedded if needed), create idem's schema, and point Dagster's
    instance at the same server.

    Returns:
        The PostgreSQL URL, also exported as ``IDEM_POSTGRES_URL`` for dagster.yaml.
    """
    url = resolve_postgres_url()
    os.environ[POSTGRES_URL_ENV] = url
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
    template = (resources.files("idem_platform") / "dagster.yaml").read_text(encoding="utf-8")
    chosen = os.environ.get("DAGSTER_HOME")
    if not chosen:
        home = private_dir(idem_home() / "dagster")
        target = home / "dagster.yaml"
        if not target.exists() or target.read_text(encoding="utf-8") != template:
            write_private_text(target, template)
        os.environ["DAGSTER_HOME"] = str(home)
    elif not Path(chosen).exists():
        # Dagster refuses a DAGSTER_HOME that does not exist: make it, with idem's
        # instance settings (storage on the same PostgreSQL), as the default one has.
        Path(chosen).mkdir(parents=True)
        (Path(chosen) / "dagster.yaml").write_text(template, encoding="utf-8")
    return url


def public_summary(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The summary's contract keys first, then the details."""
    out = {key: summary.get(key) for key in SUMMARY_KEYS}
    out["seconds"] = round(seconds, 3)
    if summary.get("prior") is not None:
        out["prior"] = summary["prior"]
    for key in _DETAIL_KEYS:
        if summary.get(key):
            out[key] = summary[key]
    for key in ("effects_created", "effects_suppressed"):  # zero too: the config has effects
        if summary.get(key) is not None:
            out[key] = summary[key]
    return out


def choose_connector(config: IdemConfig, given: str | None, files: Sequence[str] = ()) -> str:
    """``--connector`` (checked: a typo is a one-line error naming the connectors); else the
    connector whose directory holds every file named; else the config's only connector, or
    its only file-drop connector when files are named."""
    if given:
        return config.connector(given).name
    if len(config.connectors) == 1:
        return config.connectors[0].name
    if files:
        paths = [Path(f).resolve() for f in files]
        holders = [
            c for c in config.connectors
            if isinstance(c, FileConnectorBase) and c.path is not None and all(p.is_relative_to(c.path.resolve()) for p in paths)
        ]
        if len(holders) == 1:
            return holders[0].name
        filedrops = [c for c in config.connectors if c.kind == "filedrop"]
        if not holders and len(filedrops) == 1:
            return filedrops[0].name
    names = ", ".join(c.name for c in config.connectors) or "none"
    raise CommandError(f"{config.source or 'the config'} has several connectors: pick one with --connector ({names})")


def known_connector(config: IdemConfig, url: str, name: str) -> str:
    """``--connector`` of a command that reads what connectors left in PostgreSQL: a
    connector of the config, or one that left rows in ``idem.rejects`` (it may have been
    removed from the config since); else the config's one-line error naming its connectors.
    """
    if any(c.name == name for c in config.connectors):
        return name
    with connect(url) as conn:
        row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {SCHEMA}.rejects WHERE connector = %s)", [name]).fetchone()
    if row is not None and row[0]:
        return name
    return config.connector(name).name  # raises ConfigError: "no connector named ... (known: ...)"
