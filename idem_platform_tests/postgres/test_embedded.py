"""The embedded default (pgserver): tuned on first use, restarted only when nobody else uses it, stoppable."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from idem_platform.postgres.embedded import (
    RESTART_SETTINGS,
    alone,
    data_dir,
    embedded_postgres_url,
    stop_embedded,
)


@pytest.fixture
def home() -> Iterator[Path]:
    # pgserver's server user must reach the directory: a fresh one under /tmp, not pytest's 0700 tmp_path.
    path = Path(tempfile.mkdtemp(prefix="idem-embedded-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        stop_embedded(path)
        shutil.rmtree(path, ignore_errors=True)


def _setting(url: str, name: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
    assert row is not None
    return str(row[0])


def _downgrade(url: str, home: Path) -> None:
    """Make the server look like one started before the tuning (stock shared_buffers)."""
    import pgserver

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_buffers = '128MB'")
    server = pgserver.get_server(data_dir(home), cleanup_mode=None)
    pgserver.pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user)
    assert _setting(url, "shared_buffers") == "128MB"


def _wait_until_alone(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alone(url):
            return
        time.sleep(0.05)
    raise AssertionError(f"another client stayed connected for {timeout} s")


def test_the_embedded_server_is_tuned_restarted_only_when_alone_and_stopped(home: Path) -> None:
    url = embedded_postgres_url(home)
    for name, value in RESTART_SETTINGS.items():
        assert _setting(url, name) == value  # a fresh server was restarted with them at once

    _downgrade(url, home)
    with psycopg.connect(url, autocommit=True) as other_client:  # a webserver, a run…
        assert embedded_postgres_url(home) == url
        assert other_client.execute("SELECT 1").fetchone() == (1,)  # not cut off by a restart
        assert _setting(url, "shared_buffers") == "128MB"
    # A closed client's backend leaves pg_stat_activity a moment later (longer under load):
    # wait until the server itself sees no other client, which is what "alone" means.
    _wait_until_alone(url)
    assert embedded_postgres_url(home) == url  # alone now: restarted with the settings
    assert _setting(url, "shared_buffers") == RESTART_SETTINGS["shared_buffers"]

    assert stop_embedded(home) is True
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    assert stop_embedded(home) is False
    assert _setting(embedded_postgres_url(home), "max_connections") == RESTART_SETTINGS["max_connections"]  # starts again


def test_a_server_that_cannot_start_is_one_error_with_its_log(home: Path) -> None:
    """A data directory PostgreSQL refuses (here a setting it cannot parse) is one
    ``EmbeddedPostgresError`` naming the directory and quoting the server's log, not
    pgserver's traceback."""
    from idem_platform.errors import EmbeddedPostgresError

    embedded_postgres_url(home)
    assert stop_embedded(home)
    with (data_dir(home) / "postgresql.auto.conf").open("a") as conf:
        conf.write("shared_buffers = 'plenty'\n")
    with pytest.raises(EmbeddedPostgresError) as raised:
        embedded_postgres_url(home)
    message = str(raised.value)
    assert f"the embedded PostgreSQL in {data_dir(home)} did not start" in message
    assert "shared_buffers" in message and "IDEM_POSTGRES_URL" in message
