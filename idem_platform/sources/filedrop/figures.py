"""Each dropped file's own figures in a commit.

One commit may hold many files (the sensor's batch run). Its summary counts the
batch; a file's partition must show the file's own numbers, and they must add up to
the batch's. The commit counts them itself, with its totals
(:mod:`idem_platform.write.apply.units`): each file's entry in the summary's ``files``,
and in its ledger row, carries its rows written, skipped and rejected. A file an
earlier commit holds (a replay) reports, as skipped, the records its ledger row
counted then.

Commits made before files kept their own counts are read back from PostgreSQL: a
table row's ``_source`` is its position ``<sha256[:16]>#L<line>`` (the file's
position prefix, see :func:`~idem_platform.sources.filedrop.plan.file_unit`) and a
reject's ``source`` is its file's ledger key ``filedrop:<sha256>``; such a file's
skipped records are its lines neither written nor rejected (blank lines included).
Two files with the same bytes share one ledger key and one set of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from idem_platform.ledger import Ledger
from idem_platform.postgres.schema import SCHEMA
from idem_platform.postgres.tables import table_ident

POSITION_MARK = "#L"  # between a file's position prefix and the line number


def position_prefix(file_key: str) -> str:
    """The part of a record's position naming its file (``filedrop:<sha256>`` -> ``<sha256[:16]>``)."""
    return file_key.partition(":")[2][:16]


@dataclass(frozen=True)
class FileFigures:
    """One file's rows written (per record type), rejected and skipped in one commit."""

    commit_id: str
    written: dict[str, int] = field(default_factory=dict)  # record type -> rows
    rejected: int = 0
    skipped: int | None = None  # as the commit counted it; None: read back (lines less the rest)

    @classmethod
    def counted(cls, commit_id: str, entry: Mapping[str, Any]) -> FileFigures | None:
        """The figures a commit counted for a file (its entry in ``files``), if it kept them."""
        if "rows_skipped" not in entry:
            return None
        written = {str(rt): int(n) for rt, n in (entry.get("written") or {}).items()}
        return cls(commit_id, written, int(entry["rows_rejected"]), int(entry["rows_skipped"]))

    def skipped_of(self, lines: int) -> int:
        """Records neither written nor rejected (``lines``: the file's, when not counted)."""
        if self.skipped is not None:
            return self.skipped
        return max(lines - self.rows_written - self.rejected, 0)

    @property
    def rows_written(self) -> int:
        return sum(self.written.values())


def written_by_file(
    conn: psycopg.Connection, commit_id: str, record_types: Iterable[str], file_keys: Sequence[str] | None = None
) -> dict[str, dict[str, int]]:
    """``{position prefix: {record type: rows}}`` of a commit (only ``file_keys``' files when given)."""
    prefixes = sorted({position_prefix(k) for k in file_keys}) if file_keys is not None else None
    found: dict[str, dict[str, int]] = {}
    for record_type in sorted(set(record_types)):
        table = table_ident(record_type).as_string(conn)
        rows = conn.execute(
            f"SELECT split_part(_source, %(mark)s, 1) AS prefix, count(*) FROM {table} "
            "WHERE _commit_id = %(commit)s::uuid "
            "AND (%(prefixes)s::text[] IS NULL OR split_part(_source, %(mark)s, 1) = ANY(%(prefixes)s::text[])) "
            "GROUP BY 1",
            {"mark": POSITION_MARK, "commit": commit_id, "prefixes": prefixes},
        ).fetchall()
        for prefix, count in rows:
            found.setdefault(str(prefix), {})[record_type] = int(count)
    return found


def rejected_by_file(conn: psycopg.Connection, commit_id: str) -> dict[str, int]:
    """``{file key: rejects}`` a commit recorded."""
    rows = conn.execute(
        f"SELECT source, count(*) FROM {SCHEMA}.rejects WHERE commit_id = %s::uuid GROUP BY source", [commit_id]
    ).fetchall()
    return {str(source): int(count) for source, count in rows}


def reject_samples(
    conn: psycopg.Connection, commit_id: str, file_keys: Sequence[str], limit: int
) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """Each file's first ``limit`` rejects of a commit, ``(position, reasons)``, in one query."""
    rows = conn.execute(
        f"SELECT source, position, reasons FROM (SELECT source, position, reasons, reject_id, "
        "row_number() OVER (PARTITION BY source ORDER BY reject_id) AS n "
        f"FROM {SCHEMA}.rejects WHERE commit_id = %s::uuid AND source = ANY(%s)) r "
        "WHERE n <= %s ORDER BY source, reject_id",
        [commit_id, list(file_keys), limit],
    ).fetchall()
    samples: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for source, position, reasons in rows:
        samples.setdefault(str(source), []).append((str(position), list(reasons)))
    return samples


def held_results(conn: psycopg.Connection, connector: str, file_keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{file key: its ledger row's result}`` of the committed files (``commit_id``: the
    commit holding its rows, ``files``: its own entry)."""
    with conn.transaction():
        entries = Ledger(conn, connector).entries(sorted(set(file_keys)))
    return {
        key: dict(entry.result)
        for key, entry in entries.items()
        if entry.status == "committed" and entry.result and entry.result.get("commit_id")
    }


def own_entry(files: Iterable[Mapping[str, Any]], source: Mapping[str, Any]) -> Mapping[str, Any]:
    """The entry of ``source``'s file among a result's ``files`` (by path, else by key)."""
    entries = list(files)
    for entry in entries:
        if entry.get("file") == source.get("file") and entry.get("key") == source.get("key"):
            return entry
    return next((e for e in entries if e.get("key") == source.get("key")), {})


def file_figures(
    conn: psycopg.Connection,
    sources: Sequence[Mapping[str, Any]],
    batch: Mapping[str, Any],
    held: Mapping[str, Mapping[str, Any]],
    record_types: Iterable[str],
) -> dict[str, FileFigures]:
    """``{file key: its figures}``: those the batch's commit (``batch``: its summary) or,
    for a file an earlier commit holds, that commit (``held``: ledger results) counted;
    read back from PostgreSQL where a commit kept no counts of its own."""
    figures: dict[str, FileFigures] = {}
    missing: dict[str, str] = {}
    for source in sources:
        key = str(source.get("key") or "")
        mine = not batch.get("replayed") and own_entry(batch.get("files") or [], source)
        result = batch if mine else held.get(key)
        if not result or not result.get("commit_id"):
            continue
        found = FileFigures.counted(str(result["commit_id"]), own_entry(result.get("files") or [], source))
        if found is None:
            missing[key] = str(result["commit_id"])
        else:
            figures.setdefault(key, found)
    figures.update(read_back(conn, missing, record_types))
    return figures


def read_back(
    conn: psycopg.Connection, holders: Mapping[str, str], record_types: Iterable[str]
) -> dict[str, FileFigures]:
    """``{file key: its figures}`` read from PostgreSQL in the commit that holds it
    (``holders``), one query per commit and table, whatever the number of files."""
    by_commit: dict[str, list[str]] = {}
    for key, commit_id in holders.items():
        by_commit.setdefault(commit_id, []).append(key)
    types = list(record_types)
    figures: dict[str, FileFigures] = {}
    for commit_id, keys in by_commit.items():
        written = written_by_file(conn, commit_id, types, keys)
        rejected = rejected_by_file(conn, commit_id)
        for key in keys:
            figures[key] = FileFigures(commit_id, written.get(position_prefix(key), {}), rejected.get(key, 0))
    return figures


def file_summary(
    source: Mapping[str, Any], figures: FileFigures | None, batch: Mapping[str, Any]
) -> dict[str, Any]:
    """One file's summary in a batch commit's words (``batch``: the commit's summary).

    A file committed by this commit reports its own rows written, skipped and
    rejected. A file an earlier commit holds (a replay) wrote and rejected nothing
    now: all its records are skipped, and ``prior`` carries what that commit counted
    for it. ``figures`` is ``None`` for a file no commit holds.
    """
    lines = int(source.get("lines") or 0)
    key = str(source.get("key") or "")
    summary: dict[str, Any] = {
        "commit_id": batch.get("commit_id"),
        "file_key": key,
        "files": [dict(source)],
        "seconds": batch.get("seconds"),
    }
    if figures is None:
        return {**summary, "rows_written": 0, "rows_skipped": lines, "rows_rejected": 0, "replayed": False}
    held = {
        "rows_written": figures.rows_written,
        "rows_skipped": figures.skipped_of(lines),
        "rows_rejected": figures.rejected,
    }
    if figures.commit_id == batch.get("commit_id"):
        tables = {rt: {"written": n} for rt, n in sorted(figures.written.items())}
        return {**summary, **held, "replayed": False, "tables": tables}
    return {
        **summary, "rows_written": 0, "rows_skipped": sum(held.values()) if figures.skipped is not None else lines,
        "rows_rejected": 0, "replayed": True, "prior": {"commit_id": figures.commit_id, **held},
    }
