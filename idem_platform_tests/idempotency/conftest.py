"""The idempotency tests' fixture: an emptied database with the tables their handlers write."""

from __future__ import annotations

import pytest

from idem_platform.postgres import connect
from idem_platform_tests.helpers.database import reset_database


@pytest.fixture
def url(pg_url: str) -> str:
    reset_database(pg_url)
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.side_effects, public.race_runs")
        conn.execute("CREATE TABLE public.side_effects (key text, note text)")
        conn.execute("CREATE TABLE public.race_runs (runner int)")
    return pg_url
