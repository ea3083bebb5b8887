"""A commit's summary survives the trip through Dagster metadata (what the CLI and the checks read back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from idem_platform.defs.summary import summary_from_metadata, summary_metadata


def _summary() -> dict[str, Any]:
    return {
        "commit_id": "c0ffee",
        "rows_written": 3,
        "rows_skipped": 1,
        "rows_rejected": 0,
        "replayed": False,
        "seconds": 1.5,
        "files": [{"file": "/drop/a.ndjson", "key": "filedrop:ab12", "bytes": 40, "lines": 4}],
        "tables": {
            "indicator": {
                "written": 3,
                "skipped": 1,
                "new_columns": ["fresh"],
                "to_props": ["PROPS", "xmin"],
                "props_fields": {
                    "PROPS": "has capitals: PostgreSQL folds names, it would meet 'props'",
                    "xmin": "a PostgreSQL system column name",
                },
            },
            "malware": {"written": 0, "skipped": 0, "new_columns": [], "to_props": [], "props_fields": {}},
            "customer": {  # an upsert table: what its current state became
                "written": 4, "skipped": 0, "inserted": 1, "updated": 1, "deleted": 1, "stale": 1,
                "new_columns": [], "to_props": [], "props_fields": {},
            },
        },
    }


def test_every_table_figure_survives_metadata_and_back() -> None:
    """The CLI's JSON summary is rebuilt from the materialization's metadata: nothing the commit
    computed (``props_fields``: which fields went to ``props``, and why) may be lost on the way."""
    summary = _summary()
    rebuilt = summary_from_metadata(summary_metadata(summary))
    assert rebuilt["tables"]["indicator"] == summary["tables"]["indicator"]
    assert rebuilt["tables"]["customer"] == summary["tables"]["customer"]
    assert rebuilt["files"] == summary["files"]
    for key in ("commit_id", "rows_written", "rows_skipped", "rows_rejected", "replayed"):
        assert rebuilt[key] == summary[key]


def test_files_are_shown_relative_to_the_drop_directory_without_inodes(tmp_path: Path) -> None:
    """What the UI shows of a file: its path as its partition names it and its figures; the
    stamps the sensor compares (inode, times) stay in the ledger. The CLI gets the path whole."""
    inside = tmp_path / "drop" / "eu" / "a.ndjson"
    entry = {"file": str(inside), "key": "filedrop:ab12", "bytes": 40, "lines": 4, "mtime_ns": 1, "ctime_ns": 2, "inode": 77}
    outside = {**entry, "file": str(tmp_path / "elsewhere.ndjson")}
    metadata = summary_metadata({**_summary(), "files": [entry, outside]}, drop_dir=tmp_path / "drop")
    shown = metadata["files"].value
    assert shown[0] == {"file": "eu/a.ndjson", "key": "filedrop:ab12", "bytes": 40, "lines": 4}
    assert shown[1]["file"] == str(tmp_path / "elsewhere.ndjson") and "inode" not in shown[1]
    assert "dagster/row_count" not in metadata  # rows_written says it once
    rebuilt = summary_from_metadata(metadata, tmp_path / "drop")
    assert [f["file"] for f in rebuilt["files"]] == [str(inside), str(tmp_path / "elsewhere.ndjson")]


def test_props_fields_are_shown_with_their_reasons() -> None:
    metadata = summary_metadata(_summary())
    assert metadata["props_fields/indicator"].value["xmin"] == "a PostgreSQL system column name"
    assert "props_fields/malware" not in metadata  # nothing went to props there
