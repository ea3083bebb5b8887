"""What became of a landed body: ``GET /v1/commits/{file_key}``.

A pushed body is acknowledged when it is landed, not when its rows are committed
(the file-drop sensor or ``idem ingest`` commits it later). A client that wants to
know more asks with the file key of its answer; the file ledger of the connector
says whether the rows are committed, by which commit, and what was rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from idem_platform.config import ConnectorConfig
from idem_platform.ledger import Ledger
from idem_platform.postgres.schema import SCHEMA

REJECTS_SHOWN = 20


def request_namespace(connector: ConnectorConfig) -> str:
    """The ledger namespace of a connector's request keys, apart from its file keys."""
    return f"http:{connector.name}"


def body_status(conn: psycopg.Connection, connectors: Sequence[ConnectorConfig], file_key: str) -> dict[str, Any] | None:
    """The state of the body ``file_key`` among ``connectors``, or ``None`` if none landed it.

    ``status``: ``landed`` (waiting for the sensor or ``idem ingest``), ``ingesting``,
    ``committed`` (with the commit's id and counts, this file's own counts and its
    first rejects) or ``failed`` (with the error and whether it will be retried).
    """
    for connector in connectors:
        entry = Ledger(conn, connector.name).entries([file_key]).get(file_key)
        landed = conn.execute(
            f"SELECT result FROM {SCHEMA}.ingest_ledger WHERE namespace = %s AND status = 'committed' "
            "AND result->>'file_key' = %s LIMIT 1",
            [request_namespace(connector), file_key],
        ).fetchone()
        if entry is None and landed is None:
            continue
        answer: dict[str, Any] = {"file_key": file_key, "connector": connector.name}
        if landed is not None:
            answer.update({k: landed[0][k] for k in ("path", "lines", "bytes") if k in landed[0]})
        if entry is None:
            return {**answer, "status": "landed"}
        if entry.status == "in_progress":
            return {**answer, "status": "ingesting", "attempt": entry.attempts}
        if entry.status == "failed":
            error = entry.error or {}
            return {
                **answer,
                "status": "failed",
                "error": error.get("message"),
                "retryable": bool(error.get("retryable", False)),
                "attempts": entry.attempts,
            }
        result = entry.result or {}
        commit_id = result.get("commit_id")
        rejects = conn.execute(
            f"SELECT position, line, reasons FROM {SCHEMA}.rejects WHERE commit_id = %s AND source = %s "
            "ORDER BY line NULLS LAST, reject_id LIMIT %s",
            [commit_id, file_key, REJECTS_SHOWN],
        ).fetchall()
        rejected = conn.execute(
            f"SELECT count(*) FROM {SCHEMA}.rejects WHERE commit_id = %s AND source = %s", [commit_id, file_key]
        ).fetchone()
        return {
            **answer,
            "status": "committed",
            "commit_id": commit_id,
            "commit": {k: result.get(k) for k in ("rows_written", "rows_skipped", "rows_rejected", "run_id")},
            "rows_rejected": int(rejected[0]) if rejected else 0,
            "rejects": [{"position": p, "line": line, "reasons": reasons} for p, line, reasons in rejects],
        }
    return None
