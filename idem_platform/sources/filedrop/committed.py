"""Which of the files in a drop directory the ledger already committed, without reading them.

A committed file's ledger row keeps the commit's result, whose ``files`` name
each file's path, size, modification and change times and inode as it was
hashed. A file still at that path with all four unchanged is that file (a
writer can restore size and mtime, not the change time): the sensor neither hashes it
again nor remembers it in its cursor, so the cursor holds only the files still
settling or not committed yet, however many files the directory keeps.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from idem_platform.postgres.schema import SCHEMA


def committed_files(
    conn: psycopg.Connection, connector: str, paths: Iterable[str]
) -> dict[str, tuple[int, int, int, int]]:
    """``{absolute path: (size, mtime_ns, ctime_ns, inode)}`` of the given paths that a committed
    ledger row names (as the file was when it was hashed)."""
    wanted = list(paths)
    if not wanted:
        return {}
    rows = conn.execute(
        f"""
        SELECT f ->> 'file', (f ->> 'bytes')::bigint, (f ->> 'mtime_ns')::bigint,
               (f ->> 'ctime_ns')::bigint, (f ->> 'inode')::bigint
        FROM {SCHEMA}.ingest_ledger l
        CROSS JOIN LATERAL jsonb_array_elements(coalesce(l.result -> 'files', '[]'::jsonb)) f
        WHERE l.namespace = %s AND l.status = 'committed' AND f ->> 'file' = ANY(%s) AND f ? 'ctime_ns'
        """,
        [connector, wanted],
    ).fetchall()
    return {path: (int(size), int(mtime), int(ctime), int(inode)) for path, size, mtime, ctime, inode in rows}
