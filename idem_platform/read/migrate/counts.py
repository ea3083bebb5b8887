"""Step 1 of ``idem migrate``: count the rows below the current version, by version and step.

One ``GROUP BY`` per table on the driver; ``--dry-run`` (:func:`plan_migration`)
stops here and writes nothing. :func:`step_counts` is shared with the job's
summary, which fills in the rows moved and failed per step.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.errors import ConfigError
from idem_platform.migrations import Chains
from idem_platform.postgres.connection import connect
from idem_platform.postgres.tables import existing_columns, table_ident
from idem_platform.read.migrate.report import build_report
from idem_platform.read.plan import PAYLOAD_VERSION


def plan_migration(url: str, config: IdemConfig, record_types: Sequence[str] | None = None) -> dict[str, Any]:
    """What ``idem migrate`` would move, per record type and step; writes nothing.

    Returns:
        ``{"dry_run": True, "tables": {record_type: entry}, "rows_to_move", "rows_moved": 0,
        "rows_failed": 0, "seconds"}``; each entry: ``exists``, ``current_version``,
        ``rows_current``, ``rows_to_move``, ``rows_by_version`` (rows below the current
        version by the version their upgrade starts from), ``rows_newer`` (stored at a
        version past the config's: never touched), ``steps`` (per step: ``step``,
        ``function``, ``rows_to_move``, ``rows_moved``, ``rows_failed``), ``rows_moved``,
        ``rows_failed``, ``failed_examples``, ``batches``, ``seconds``.

    Raises:
        ConfigError: an unknown record type, migration modules that cannot be imported.
        MigrationChainError: a broken chain.
    """
    started = time.monotonic()
    chains = config.chains()
    tables: dict[str, dict[str, Any]] = {}
    with connect(url, autocommit=True, application_name="idem-migrate-plan") as conn:
        for record_type in selected_types(config, record_types):
            tables[record_type] = count_entry(conn, chains, record_type, config.tables[record_type].schema_version)
    return build_report(tables, dry_run=True, started=started)


def selected_types(config: IdemConfig, record_types: Sequence[str] | None) -> list[str]:
    """The record types to migrate, sorted (``None`` or empty: every declared one).

    Raises:
        ConfigError: a record type the config does not declare.
    """
    if not record_types:
        return sorted(config.tables)
    unknown = sorted(set(record_types) - set(config.tables))
    if unknown:
        known = ", ".join(sorted(config.tables)) or "none declared"
        raise ConfigError(f"unknown record type {', '.join(map(repr, unknown))} (known: {known})")
    return sorted(set(record_types))


def count_entry(conn: psycopg.Connection, chains: Chains, record_type: str, current: int) -> dict[str, Any]:
    """One statement: rows per (stored version, payload version)."""
    started = time.monotonic()
    columns = existing_columns(conn, record_type)
    entry: dict[str, Any] = {
        "exists": bool(columns),
        "current_version": current,
        "rows_current": 0,
        "rows_to_move": 0,
        "rows_by_version": {},
        "rows_newer": 0,
        "steps": [],
        "rows_moved": 0,
        "rows_failed": 0,
        "failed_examples": [],
        "batches": 0,
        "seconds": 0.0,
    }
    if not columns:
        return entry
    source = (
        sql.SQL("coalesce({}, _schema_version)").format(sql.Identifier(PAYLOAD_VERSION))
        if PAYLOAD_VERSION in columns
        else sql.SQL("_schema_version")
    )
    counted = conn.execute(
        sql.SQL("SELECT _schema_version, {}, count(*) FROM {} GROUP BY 1, 2").format(source, table_ident(record_type))
    ).fetchall()
    by_version: Counter[int] = Counter()
    for stored, start, count in counted:
        if stored == current:
            entry["rows_current"] += int(count)
        elif stored > current:
            entry["rows_newer"] += int(count)
        else:
            by_version[int(start)] += int(count)
    entry["rows_by_version"] = {str(v): n for v, n in sorted(by_version.items())}
    entry["rows_to_move"] = sum(by_version.values())
    entry["steps"] = step_counts(chains, record_type, current, by_version, Counter(), Counter())
    entry["seconds"] = round(time.monotonic() - started, 3)
    return entry


def step_counts(
    chains: Chains,
    record_type: str,
    current: int,
    to_move: Counter[int],
    moved: Counter[int],
    failed: Counter[int],
) -> list[dict[str, Any]]:
    """Per step ``v -> v+1`` from the oldest version found: the rows that go through it
    (every row starting at ``v`` or before), moved, and failed at it."""
    if not to_move:
        return []
    chain = chains.steps.get(record_type, {})
    steps = []
    for start in range(min(to_move), current):
        migration = chain.get(start)
        steps.append({
            "step": f"{record_type} v{start}->v{start + 1}",
            "function": migration.name if migration is not None else None,
            "rows_to_move": sum(n for v, n in to_move.items() if v <= start),
            "rows_moved": sum(n for v, n in moved.items() if v <= start),
            "rows_failed": failed.get(start, 0),
        })
    return steps


