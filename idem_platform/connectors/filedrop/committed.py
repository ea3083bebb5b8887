"""Which of the files in a drop directory the ledger already committed, without reading them.

A committed file's ledger row keeps the commit's result, whose ``files`` name
each file's path, size and modification time as it was hashed. A file still at
that path with that size and mtime is that file: the sensor neither hashes it
again nor remembers it in its cursor, so the cursor holds only the files still
settling or not committed yet, however many files the directory keeps.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from idem_platform.postgres.schema import SCHEMA


def committed_files(conn: psycopg.Connection, connector: str, paths: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``{absolute path: (size, mtime_ns)}`` of the given paths that a committed ledger row names."""
    wanted = list(paths)
    if not wanted:
        return {}
    rows = conn.execute(
        f"""
        SELECT f ->> 'file', (f ->> 'bytes')::bigint, (f ->> 'mtime_ns')::bigint
        FROM {SCHEMA}.ingest_ledger l
        CROSS JOIN LATERAL jsonb_array_elements(coalesce(l.result -> 'files', '[]'::jsonb)) f
        WHERE l.namespace = %s AND l.status = 'committed' AND f ->> 'file' = ANY(%s) AND f ? 'mtime_ns'
        """,
        [connector, wanted],
    ).fetchall()
    return {path: (int(size), int(mtime)) for path, size, mtime in rows}
