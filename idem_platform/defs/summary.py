"""A commit's summary as Dagster metadata people read, and back.

The ``committed`` materialization carries flat numbers (rows written, skipped
and rejected, per table too, a rounded reject ratio), a markdown table per
record type, the commit id, the files or offset ranges, and a sample of the
rejects with their reasons; no raw blob repeating all of it. The same entries
are enough to rebuild the summary for machines (the CLI's JSON line, the checks,
``load_input``): :func:`summary_from_metadata` is the inverse of
:func:`summary_metadata` for every key they need.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from idem_platform.postgres.schema import qualified_table_name

EFFECT_KEYS = ("effects_created", "effects_suppressed")  # when the config has effects on the tables written
# Kept as JSON entries: lists and small maps a machine rebuilds the summary from.
JSON_KEYS = ("files", "offsets", "schema_versions", "prior", "timings", "consumer_group", "notes")
FLAT_KEYS = ("commit_id", "rows_written", "rows_skipped", "rows_rejected", "replayed", "seconds", "replay_skipped",
             "tombstones_skipped")
TEXT_KEYS = ("already_committed", "file_key")  # file_key: the figures are one file's of a batch
# Per table; an upsert table's current state also: inserted, updated, deleted, stale (history only).
PER_TABLE = ("written", "skipped", "inserted", "updated", "deleted", "stale")
REJECT_SAMPLE = 20
REJECT_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn(
            "position", "string", description="where the record was: `<file sha256[:16]>#L<line>`, `<topic>-<partition>@<offset>`"
        ),
        dg.TableColumn("field", "string", description="the field the reason is about (empty: the whole record)"),
        dg.TableColumn("rule", "string", description="the rule it broke (`parse`, `type`, `required`, ...)"),
        dg.TableColumn("message", "string", description="the reason, for people (at most 300 characters)"),
    ]
)


FILE_FIELDS = ("file", "key", "bytes", "lines", "rows_written", "rows_skipped", "rows_rejected")
"""What a ``files`` entry shows: the file and its figures. Its ``mtime_ns``, ``ctime_ns`` and
``inode`` tell the sensor a file rewritten in place from the one committed; they stay in the
ledger, where the sensor reads them, and mean nothing to a person."""

METADATA_GLOSSARY = (
    "Metadata of each materialization: `rows_written`, `rows_skipped` (keys already held, repeats, "
    "blank lines), `rows_rejected` (quarantined in `idem.rejects`; `rejects` shows the first "
    f"{REJECT_SAMPLE} reasons) and `reject_ratio`; `written/<record_type>` and `skipped/<record_type>` "
    "per table, and for an upsert table `inserted/`, `updated/`, `deleted/` and `stale/<record_type>` (what "
    "its current state became; stale: older versions, kept in history only); `tables` the same as a table; `commit_id` (`idem.commits`); `replayed` (nothing new: "
    "`prior` holds the commit that wrote these records); `files` (path relative to the drop directory, "
    "file key, bytes, lines and its own figures) or `offsets`; `schema_versions`, `timings`, `seconds`. "
    "A batch run's partitions also share its totals as `batch_files` and `batch_rows_*`."
)
"""What ``committed``'s metadata entries mean: Dagster 1.13 metadata values carry no
description of their own, so the asset's description says it once."""


def shown_file(path: str, drop_dir: Path | None) -> str:
    """``path`` relative to the drop directory (as its partition key names it), or as it is
    when outside it (``idem ingest`` of any file) or when there is no drop directory."""
    if drop_dir is None or not path:
        return path
    try:
        return Path(path).resolve().relative_to(drop_dir.resolve()).as_posix()
    except ValueError:
        return path


def _shown_files(files: list[dict[str, Any]], drop_dir: Path | None) -> list[dict[str, Any]]:
    return [
        {k: (shown_file(str(v), drop_dir) if k == "file" else v) for k, v in f.items() if k in FILE_FIELDS}
        for f in files
    ]


def _table_markdown(tables: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["| table | written | skipped | new columns |", "|---|---:|---:|---|"]
    for record_type, counts in sorted(tables.items()):
        new = ", ".join(counts.get("new_columns") or []) or "—"
        lines.append(f"| `{qualified_table_name(record_type)}` | {counts.get('written', 0):,} | {counts.get('skipped', 0):,} | {new} |")
    return "\n".join(lines)


def reject_ratio(summary: Mapping[str, Any]) -> float:
    """Rejected records over all records of the commit, rounded to 4 places."""
    total = sum(int(summary.get(k) or 0) for k in ("rows_written", "rows_skipped", "rows_rejected"))
    return round(int(summary.get("rows_rejected") or 0) / total, 4) if total else 0.0


def reject_sample(rejects: list[tuple[str, list[dict[str, Any]]]]) -> dg.MetadataValue:
    """The first rejects (position, field, rule, message), one row per reason."""
    records = [
        dg.TableRecord({"position": position, "field": reason.get("field") or "", "rule": reason.get("rule") or "",
                        "message": str(reason.get("message") or "")[:300]})
        for position, reasons in rejects
        for reason in reasons
    ][:REJECT_SAMPLE]
    return dg.MetadataValue.table(records, schema=REJECT_SCHEMA)


def summary_metadata(
    summary: Mapping[str, Any],
    *,
    rejects: list[tuple[str, list[dict[str, Any]]]] | None = None,
    drop_dir: Path | None = None,
) -> dict[str, Any]:
    """The metadata of a ``committed`` materialization (``drop_dir``: what ``files`` are shown
    relative to).

    ``rows_written`` is the one figure of rows written: no ``dagster/row_count`` beside it
    saying the same (the ``idem/<record_type>`` table assets carry the tables' row counts)."""
    metadata: dict[str, Any] = {}
    commit_id = summary.get("commit_id")
    metadata["commit_id"] = dg.MetadataValue.text(str(commit_id)) if commit_id else dg.MetadataValue.null()
    for key in ("rows_written", "rows_skipped", "rows_rejected"):
        metadata[key] = dg.MetadataValue.int(int(summary.get(key) or 0))
    metadata["replayed"] = dg.MetadataValue.bool(bool(summary.get("replayed")))
    if summary.get("replay_skipped"):  # of rows_skipped: records of units committed before
        metadata["replay_skipped"] = dg.MetadataValue.int(int(summary["replay_skipped"]))
    if summary.get("tombstones_skipped"):  # of rows_skipped: a Debezium feed's tombstones
        metadata["tombstones_skipped"] = dg.MetadataValue.int(int(summary["tombstones_skipped"]))
    metadata["seconds"] = dg.MetadataValue.float(round(float(summary.get("seconds") or 0.0), 2))
    for key in EFFECT_KEYS:
        if summary.get(key) is not None:
            metadata[key] = dg.MetadataValue.int(int(summary[key]))
    metadata["reject_ratio"] = dg.MetadataValue.float(reject_ratio(summary))
    tables = summary.get("tables") or {}
    if tables:
        metadata["tables"] = dg.MetadataValue.md(_table_markdown(tables))
    for record_type, counts in sorted(tables.items()):
        for key in PER_TABLE:
            if key in counts:  # a file of a batch knows its rows written per table, not its skips
                metadata[f"{key}/{record_type}"] = dg.MetadataValue.int(int(counts[key] or 0))
        if counts.get("new_columns"):
            metadata[f"new_columns/{record_type}"] = dg.MetadataValue.text(", ".join(counts["new_columns"]))
        if counts.get("to_props"):
            metadata[f"to_props/{record_type}"] = dg.MetadataValue.text(", ".join(counts["to_props"]))
        if counts.get("props_fields"):  # each field that went to props, with why
            metadata[f"props_fields/{record_type}"] = dg.MetadataValue.json(dict(counts["props_fields"]))
    for key in JSON_KEYS:
        if summary.get(key):
            value = _shown_files(list(summary[key]), drop_dir) if key == "files" else summary[key]
            metadata[key] = dg.MetadataValue.json(value)
    for key in TEXT_KEYS:
        if summary.get(key):
            metadata[key] = dg.MetadataValue.text(str(summary[key]))
    if summary.get("nothing_to_ingest"):
        metadata["nothing_to_ingest"] = dg.MetadataValue.bool(True)
    if rejects:
        metadata["rejects"] = reject_sample(rejects)
    return metadata


BATCH_KEYS = ("commit_id", "seconds", "schema_versions", "timings")


def batch_metadata(summary: Mapping[str, Any], files: int) -> dict[str, Any]:
    """What every file's partition of a batch run shares: the commit, its time, and the
    batch's totals under ``batch_*`` names (the files' own figures are their partitions')."""
    metadata = {key: value for key, value in summary_metadata(summary).items() if key in BATCH_KEYS}
    metadata["batch_files"] = dg.MetadataValue.int(files)
    for key in ("rows_written", "rows_skipped", "rows_rejected"):
        metadata[f"batch_{key}"] = dg.MetadataValue.int(int(summary.get(key) or 0))
    return metadata


def summary_from_metadata(metadata: Mapping[str, Any], drop_dir: Path | None = None) -> dict[str, Any]:
    """The commit's summary rebuilt from a ``committed`` materialization's metadata
    (``drop_dir``: the drop directory its ``files`` are relative to, made whole again)."""
    values = {key: getattr(value, "value", value) for key, value in metadata.items()}
    summary: dict[str, Any] = {key: values.get(key) for key in FLAT_KEYS}
    summary["files"] = [
        {**f, "file": str(drop_dir.resolve() / f["file"])}
        if drop_dir is not None and f.get("file") and not Path(f["file"]).is_absolute()
        else f
        for f in values.get("files") or []
    ]
    tables: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        kind, _, record_type = key.partition("/")
        if record_type and kind in (*PER_TABLE, "new_columns", "to_props", "props_fields"):
            entry = tables.setdefault(
                record_type, {"written": 0, "skipped": 0, "new_columns": [], "to_props": [], "props_fields": {}}
            )
            if kind in PER_TABLE or kind == "props_fields":
                entry[kind] = value
            else:
                entry[kind] = [v for v in str(value).split(", ") if v]
    if tables:
        summary["tables"] = tables
    for key in (*JSON_KEYS[1:], *TEXT_KEYS, *EFFECT_KEYS, "nothing_to_ingest"):
        if values.get(key) is not None:
            summary[key] = values[key]
    return summary
