"""The report of ``idem migrate`` (and of its dry run): the totals, and the text for a person.

Both the dry run (:mod:`.counts`) and the migrate (:mod:`.run`) build the same
report; the CLI and the Dagster op print it. Kept apart from the counting and the
job so how a report reads changes in one place.
"""

from __future__ import annotations

import time
from typing import Any

from idem_platform.postgres.schema import qualified_table_name


def build_report(tables: dict[str, dict[str, Any]], *, dry_run: bool, started: float) -> dict[str, Any]:
    """The report's totals over its tables' entries (the shape :func:`~idem_platform.read.migrate.counts.plan_migration` documents)."""
    return {
        "dry_run": dry_run,
        "tables": tables,
        "rows_to_move": sum(t["rows_to_move"] for t in tables.values()),
        "rows_moved": sum(t["rows_moved"] for t in tables.values()),
        "rows_failed": sum(t["rows_failed"] for t in tables.values()),
        "seconds": round(time.monotonic() - started, 3),
    }


def human_report(report: dict[str, Any]) -> str:
    """A migrate's (or a dry run's) report for a person at a terminal."""
    dry = bool(report.get("dry_run"))
    verb = "would move" if dry else "moved"
    if dry:
        head = (
            f"idem migrate --dry-run: {report['rows_to_move']:,} rows would move to their current version "
            "(nothing written)"
        )
    else:
        head = (
            f"idem migrate: {report['rows_moved']:,} rows moved to their current version, "
            f"{report['rows_failed']:,} failed, in {float(report.get('seconds') or 0):.1f} s"
        )
    lines = [head]
    for record_type, entry in report["tables"].items():
        current = entry["current_version"]
        if not entry["exists"]:
            lines.append(f"  {qualified_table_name(record_type)}: no table yet")
            continue
        if not entry["rows_to_move"]:
            lines.append(f"  {qualified_table_name(record_type)}: nothing to migrate ({entry['rows_current']:,} rows at v{current})")
        else:
            versions = ", ".join(f"{n:,} at v{v}" for v, n in entry["rows_by_version"].items())
            done = "" if dry else (
                f"; {entry['rows_moved']:,} moved in {entry['batches']:,} batch(es), {entry['rows_failed']:,} failed, "
                f"{entry.get('rows_left', 0):,} left below v{current} ({float(entry['seconds']):.1f} s)"
            )
            lines.append(f"  {qualified_table_name(record_type)} (v{current}): {entry['rows_current']:,} current, {versions}{done}")
        for step in entry["steps"]:
            count = step["rows_to_move"] if dry else step["rows_moved"]
            failed = f", {step['rows_failed']:,} failed" if step["rows_failed"] else ""
            lines.append(f"    {step['step']} ({step['function']}): {count:,} {verb}{failed}")
        if entry["rows_newer"]:
            newer = f"{entry['rows_newer']:,} rows stored at a version newer than v{current}"
            lines.append(f"    {newer}: left as they are")
        for example in entry["failed_examples"]:
            lines.append(f"    failed: {example['_idempotency_key']}  {example['error']}")
    return "\n".join(lines)
