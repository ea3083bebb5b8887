"""Enrichment results as data: an effect's delivered answers kept as ``idem.<results_table>``.

One row per minted key (the outbox row's key): which effect, record and identity it answers,
the response as ``jsonb`` (the HTTP body parsed as JSON, or a JSON string when it is not
JSON; a function's JSON result), the HTTP status (null for a function) and when it was
delivered. The row is written by the transaction that marks its outbox row delivered
(:mod:`.delivery`), so a result exists if and only if its delivery is recorded: a
dispatcher killed between the receiver's answer and the recording leaves neither, and the
retry (same key, the receiver's idempotency) writes the one row.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA

# The longest response body read for a results table (a request's answer is bounded).
MAX_RESULT_BYTES = 1_000_000

_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    key           text PRIMARY KEY,
    effect        text NOT NULL,
    record_type   text NOT NULL,
    external_id   text,
    record_key    text NOT NULL,
    response      jsonb,
    status        integer,
    delivered_at  timestamptz NOT NULL
)
"""


def results_ident(name: str) -> sql.Composed:
    """``idem.<name>``, quoted."""
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(name))


def ensure_results_tables(conn: psycopg.Connection, names: list[str]) -> None:
    """Create the results tables that do not exist yet (under idem's DDL lock: two dispatchers
    starting at once do not race on the catalog)."""
    if not names:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        for name in names:
            conn.execute(sql.SQL(_DDL).format(table=results_ident(name)))


def as_json(text: str) -> Any:
    """A response body as the value stored: its JSON when it is JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def results_lines(conn: psycopg.Connection, name: str, limit: int | None = None) -> list[str]:
    """The rows of ``idem.<name>`` as JSON lines, oldest delivery first (``idem read <name>``).

    A results table that does not exist yet (nothing delivered, no dispatcher ran) reads as empty.
    """
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{SCHEMA}.{name}"]).fetchone()
    if not exists or not exists[0]:
        return []
    query = sql.SQL("SELECT to_jsonb(r)::text FROM {table} r ORDER BY delivered_at, key LIMIT %s").format(
        table=results_ident(name)
    )
    return [line for (line,) in conn.execute(query, [limit]).fetchall()]
