"""``_payload`` is the record as received: every number exactly as sent, never through a double.

DESIGN §4. The record key and content hash stay those of the canonical form (whose
floats are doubles); ``_payload`` is filled from the received bytes, which PostgreSQL's
jsonb reads as ``numeric``, exactly. jsonb prints a number in its own plain notation
(``1E+2`` as ``100``, ``1e-999`` as ``0.000…1``; numeric has no ``-0``), so what a row
must hold is ``'<the line>'::jsonb``, not the canonical form's ``1.0`` or ``0.0``.

Each path that writes ``_payload`` is taken: a file-drop ingest through Spark (the C path,
direct rows where it can), and in-process commits through direct rows, through the C
path's Arrow batch, and through the Python path alone (``IDEM_NATIVE=0``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from idem_platform.coercion import native
from idem_platform.coercion.records import (
    DROP,
    DirectRows,
    RecordSpec,
    coerce_batch,
    direct_supported,
)
from idem_platform.config import IdemConfig
from idem_platform.contract.canonical import canonical_bytes
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.contract.keys import content_hash, record_key_of
from idem_platform.migrations import MigrationSource
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform.sources.filedrop import hash_file
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.apply.transaction import apply_staged
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import StagingWriter, new_attempt_id
from idem_platform_tests.helpers import migrations_fixture
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.ingest import ingest
from idem_platform_tests.helpers.staging_fixture import claimed_plan

NUMBERS = ("1.000000000000000005", "1e-999", "123456789012345678901234567890", "-0.0", "1E+2")
TYPED = ("x", "tiny", "neg", "hundred")  # real columns: 1.000000000000000005, 1e-999, -0.0, 1E+2
# One record, its numbers in typed columns, in a dynamic column and (drop contract) in fields
# no column holds; written with spacing, a CRLF line end and a \u escape, as a producer may.
LINE = (
    '{ "type": "thing", "id": "p1", "name": "caf\\u00e9", "x": 1.000000000000000005, "tiny": 1e-999, '
    '"neg": -0.0, "hundred": 1E+2, "labels": [' + ", ".join(NUMBERS) + "], "
    '"huge": 123456789012345678901234567890, "loose": {"a": 1e-999, "b": 1.000000000000000005, "c": 1E+2} }\r\n'
)
TABLES = {
    "thing": TableSpec(
        "thing", 1,
        (Column("name", ColumnType.parse("string"), required=True), *(Column(n, ColumnType.parse("real")) for n in TYPED),
         Column("labels", ColumnType.parse("dynamic"))),
    ),
}


def _expected_jsonb(url: str, line: str) -> str:
    """What PostgreSQL's jsonb makes of the line as received."""
    with connect(url) as conn:
        ((text,),) = conn.execute("SELECT %s::jsonb::text", [line]).fetchall()
    return str(text)


def _key_and_hash(connector: str, record_type: str, line: str) -> tuple[str, str]:
    """The key and content hash as the contract defines them: on the canonical form."""
    record = json.loads(line)
    canonical = canonical_bytes(record)
    return record_key_of(connector, record_type, str(record["id"]), canonical), content_hash(canonical)


def _commit(pg_url: str, plan: CommitPlan, lines: list[str], *, direct: bool) -> tuple[dict[str, Any], int]:
    """Stage ``lines`` in process (direct rows or the Arrow batch) and apply them: the
    commit path without Spark. Returns the apply's result and how many direct rows there were."""
    writer = StagingWriter(pg_url, plan, new_attempt_id())
    rows_out = DirectRows(list(plan.tables)) if direct else None
    batch = coerce_batch(lines_batch([line.encode() for line in lines]), plan.spec, None, rows_out)
    writer.write(batch, rows_out)
    writer.close()
    message = StagedAttempt(0, writer.attempt, writer.rows, writer.with_extra, writer.rejected)
    with connect(pg_url) as conn:
        result = apply_staged(conn, plan, [message])
    taken = sum(rows_out.count(name) for name in plan.tables) if rows_out is not None else 0
    return result, taken


@pytest.fixture
def plan(pg_url: str, tmp_path: Path) -> CommitPlan:
    """A claimed one-file commit into ``thing`` (drop contract: fields no column holds stay
    in ``_payload`` only, and a record with them may still be a direct row)."""
    reset_database(pg_url)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, TABLES)
    path = write_lines(tmp_path / "f.ndjson", [LINE])
    claimed = claimed_plan(pg_url, TABLES, hash_file(path))
    spec = replace(claimed.spec, dynamic_values=False, contracts={"thing": DROP})
    return replace(claimed, spec=spec, evolve=False)


@pytest.mark.parametrize("path", ["direct", "arrow", "python"])
def test_payload_keeps_every_number_as_sent(
    pg_url: str, plan: CommitPlan, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "python":
        monkeypatch.setenv("IDEM_NATIVE", "0")
    elif not native.AVAILABLE:
        pytest.skip("the C extension is not built")
    assert path != "direct" or direct_supported(plan.spec)
    result, taken = _commit(pg_url, plan, [LINE], direct=path == "direct")
    assert result["rows_written"] == 1 and result["rows_rejected"] == 0
    assert taken == (1 if path == "direct" else 0)  # the direct path wrote this row itself
    ((payload, key, digest, *typed),) = rows(
        pg_url, 'SELECT _payload::text, _idempotency_key, _content_hash, x, tiny, neg, hundred FROM idem."thing"'
    )
    assert payload == _expected_jsonb(pg_url, LINE)
    stored = json.loads(payload, parse_float=str, parse_int=str)
    assert stored["x"] == stored["labels"][0] == stored["loose"]["b"] == "1.000000000000000005"
    assert stored["tiny"] == stored["labels"][1] == stored["loose"]["a"] == "0." + "0" * 998 + "1"
    assert stored["huge"] == stored["labels"][2] == "123456789012345678901234567890"
    assert stored["neg"] == stored["labels"][3] == "0.0"  # numeric has no negative zero; the scale stays
    assert stored["hundred"] == stored["labels"][4] == stored["loose"]["c"] == "100"
    assert stored["name"] == "café"
    assert (key, digest) == _key_and_hash("threatfeed", "thing", LINE)  # the key is the canonical form's, as before
    assert typed == [1.0, 0.0, -0.0, 100.0]  # typed columns are doubles, as declared
    ((labels,),) = rows(pg_url, 'SELECT labels::text FROM idem."thing"')
    assert labels == _expected_jsonb(pg_url, "[" + ", ".join(NUMBERS) + "]")  # dynamic: from _payload, exact


@pytest.mark.parametrize("path", ["direct", "python"])
def test_a_number_numeric_cannot_hold_is_a_reject_not_a_failed_batch(
    pg_url: str, plan: CommitPlan, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``1e-16384`` needs 16384 digits after the point (numeric keeps 16383): kept as received it
    cannot be stored, so it is that record's reject; the C path hands it to the Arrow path, whose
    refused rows are rejects (direct rows are not checked by PostgreSQL one by one)."""
    if path == "python":
        monkeypatch.setenv("IDEM_NATIVE", "0")
    elif not native.AVAILABLE:
        pytest.skip("the C extension is not built")
    lines = ['{"type":"thing","id":"ok","name":"a","x":1e-16383}', '{"type":"thing","id":"no","name":"b","x":1e-16384}']
    result, _ = _commit(pg_url, plan, lines, direct=path == "direct")
    assert (result["rows_written"], result["rows_rejected"]) == (1, 1)
    ((raw, reasons),) = rows(pg_url, "SELECT raw, reasons FROM idem.rejects")
    assert raw == lines[1] and reasons[0]["rule"] == "postgres" and "'_payload'" in reasons[0]["message"]


def test_a_file_drop_ingest_keeps_the_payload_as_received(
    pg_url: str, threatfeed: IdemConfig, spark: Any
) -> None:
    """Through Spark: a record the direct path takes (every field a column) and one with
    fields evolution adds as columns (the Arrow path), the numbers in typed, dynamic and
    evolved fields; a BOM opens the file and CRLF ends its lines."""
    lines = [
        '{"type":"indicator","id":"p1","name":"a","score":1.000000000000000005,'
        '"tags":{"a":1e-999,"b":123456789012345678901234567890,"c":-0.0,"d":1E+2,"e":1.000000000000000005}}',
        '{"type":"indicator","id":"p2","name":"b","score":1E+2,"tiny":1e-999,"huge":123456789012345678901234567890,'
        '"neg":-0.0,"exact":1.000000000000000005}',
    ]
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    connector.path.mkdir(parents=True, exist_ok=True)
    drop = connector.path / "numbers.ndjson"
    drop.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    summary = ingest(pg_url, threatfeed, spark, drop)
    assert (summary["rows_written"], summary["rows_rejected"]) == (2, 0)
    stored = dict(
        (ext, (payload, key, digest))
        for ext, payload, key, digest in rows(
            pg_url, "SELECT _external_id, _payload::text, _idempotency_key, _content_hash FROM idem.indicator"
        )
    )
    for line in lines:
        ext = json.loads(line)["id"]
        assert stored[ext][0] == _expected_jsonb(pg_url, line), ext
        assert stored[ext][1:] == _key_and_hash("threatfeed", "indicator", line), ext
    assert "1.000000000000000005" in stored["p1"][0] and "123456789012345678901234567890" in stored["p2"][0]


@pytest.mark.parametrize("native_on", [True, False])
def test_an_upgraded_record_keeps_its_payload_as_received(
    tmp_path: Path, native_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record older than its table is coerced in its upgraded shape (``_upgraded``: the
    canonical form of the migrations' output), and ``_payload`` is still its own text."""
    monkeypatch.setenv("IDEM_NATIVE", "1" if native_on else "0")
    module = f"payload_migrations_{uuid.uuid4().hex[:10]}"  # a fresh module: the registry is per module
    shutil.copy(migrations_fixture.__file__, tmp_path / f"{module}.py")
    reading = TableSpec("reading", 3, (Column("sensor", ColumnType("string"), True), Column("temperature", ColumnType("real"))))
    spec = RecordSpec(
        connector="sensors", tables={"reading": reading}, units=(("f#L", 0),), record_type="reading", evolve=False,
        migrations=MigrationSource((module,), str(tmp_path), (("reading", 3),)),
    )
    line = b'{"id": "b", "sensor": "s", "temp": 212.000000000000000001, "tiny": 1e-999, "schema_version": 1}\n'
    (row,) = coerce_batch(lines_batch([line]), spec).to_pylist()
    assert row["_errors"] is None and row["_version"] == 1 and row["reading"]["temperature"] == 100.0
    assert json.loads(row["_upgraded"]) == {"id": "b", "sensor": "s", "temperature": 100.0, "tiny": 0.0}
    assert row["_payload"].encode() == line  # as received, its version field and every digit included
