"""What the idempotency tests share: a namespace, request and result models, a user's error,
a handler that counts its runs, and reads of the ledger and of the handlers' side effects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from pydantic import BaseModel

from idem_platform.postgres import connect

NS = "payments.charges"


class ChargeRequest(BaseModel):
    order_id: str
    cents: int


class Receipt(BaseModel):
    charge_id: str
    cents: int
    issued: datetime


class CardDeclined(Exception):
    """A user's permanent error, importable by name (module level)."""


class Counter:
    """A handler factory that counts its runs and leaves a row in ``side_effects`` each time."""

    def __init__(self, conn: psycopg.Connection, key: str) -> None:
        self.conn = conn
        self.key = key
        self.calls = 0

    def returning(self, result: Any) -> Any:
        def handler() -> Any:
            self.calls += 1
            self.conn.execute("INSERT INTO public.side_effects VALUES (%s, 'ran')", [self.key])
            return result

        return handler

    def raising(self, error: BaseException) -> Any:
        def handler() -> Any:
            self.calls += 1
            self.conn.execute("INSERT INTO public.side_effects VALUES (%s, 'ran')", [self.key])
            raise error

        return handler


def ledger_row(url: str, key: str, namespace: str = NS) -> dict[str, Any] | None:
    with connect(url, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT request_hash, status, result, error, attempts, owner, updated_at "
            "FROM idem.ingest_ledger WHERE namespace = %s AND key = %s",
            [namespace, key],
        )
        row = cur.fetchone()
        return dict(zip([c.name for c in cur.description], row, strict=True)) if row else None


def side_effects(url: str, key: str) -> int:
    with connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM public.side_effects WHERE key = %s", [key]
        ).fetchone()[0]
