"""A run whose claim another run took over says so in one line, and applies nothing.

The run is held right after its claim (``IDEM_FAULT=claimed:hold:<marker>``) while the
test does what a run that found it dead does (its advisory locks gone with a lost
connection): takes the ledger rows over and drops its staging tables. Let go, the run
meets a staging table that no longer exists: that must read as the lost claim it is.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from idem_platform import errors
from idem_platform.config import IdemConfig
from idem_platform.ledger import Ledger
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.filedrop import hash_file
from idem_platform.write.staging import drop_staging_quietly
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.faults import act_when_held, stored_records
from idem_platform_tests.helpers.ingest import ingest

TAKER = "another-run/6f1c0a52-0000-4000-8000-000000000000"


def _take_over(url: str, key: str) -> None:
    """What the run that took the file over did: own its ledger row, drop the loser's staging."""
    with connect(url) as conn, conn.transaction():
        (loser,) = conn.execute("SELECT owner FROM idem.ingest_ledger WHERE key = %s", [key]).fetchone()  # type: ignore[misc]
        Ledger(conn, "threatfeed").take_over(key, TAKER)
    drop_staging_quietly(url, [str(loser).rsplit("/", 1)[1]])


def test_a_run_whose_claim_was_taken_over_fails_in_one_line_and_applies_nothing(
    pg_url: str, threatfeed: IdemConfig, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "taken.ndjson", list(threatfeed_lines(500, seed=47)))
    key = hash_file(path).key
    marker = tmp_path / "held"
    monkeypatch.setenv("IDEM_FAULT", f"claimed:hold:{marker}")
    outcome: list[BaseException | dict[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(ingest(pg_url, threatfeed, spark, path))
        except BaseException as exc:  # noqa: BLE001 - what the run raised is what the test checks
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    act_when_held(marker, lambda: _take_over(pg_url, key))
    runner.join()

    (error,) = outcome
    assert isinstance(error, errors.InFlightError), error
    text = str(error)
    assert "\n" not in text and "does not exist" not in text, text
    assert text.startswith("commit ") and f"another run ({TAKER}) took over this batch's claim on " in text, text
    assert text.endswith("; nothing of this run was applied; another run is ingesting it now"), text
    assert stored_records(pg_url) == {"indicator": [], "malware": [], "threat-actor": [], "rejects": []}
    # The row stays the taker's: the loser records no failure over it.
    assert rows(pg_url, "SELECT status, owner, error FROM idem.ingest_ledger") == [("in_progress", TAKER, None)]
    assert rows(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'") == [(0,)]
