"""Direct rows (the C path's binary COPY tuples) stage exactly what the Arrow path stages.

The same lines are staged twice into PostgreSQL, once through ``DirectRows`` and once
through the Arrow batch and pgpq, and the two attempts' tables must hold the same
rows, value for value as PostgreSQL prints them (``-0`` and ``0`` differ there), with
the same counts of rows, rejects, repeats and rows carrying unknown fields.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from idem_platform.coercion import native
from idem_platform.coercion.records import (
    DirectRows,
    RecordSpec,
    RepeatedLines,
    coerce_batch,
    direct_supported,
)
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform.sources.filedrop import hash_file
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import StagingWriter, attempt_table, new_attempt_id, staged_ident
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.staging_fixture import claimed_plan

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension is not built")

COLUMNS = (
    Column("name", ColumnType.parse("string"), required=True),
    Column("n", ColumnType.parse("int")),
    Column("big", ColumnType.parse("long")),
    Column("x", ColumnType.parse("real")),
    Column("ok", ColumnType.parse("bool")),
    Column("at", ColumnType.parse("timestamp")),
    Column("emb", ColumnType.parse("vector(3)")),
    Column("labels", ColumnType.parse("dynamic")),
)
TABLES = {
    "thing": TableSpec("thing", 1, COLUMNS),
    "other": TableSpec("other", 1, (Column("name", ColumnType.parse("string")), Column("at", ColumnType.parse("timestamp")))),
}

# Values at the edges of what the direct path takes, and just past them (declined: the
# Arrow or Python path decides, which the comparison covers too).
NAMES = ["plain", 'quo"te', "new\nline", "é", "naïve ☃", "😀", "\u00e9\u0301", "tab\tbed", "back\\slash", "", " "]
INTS = [0, 1, -1, 2147483647, -2147483648, 2147483648, -2147483649, 10**15, None]
LONGS = [0, 9223372036854775807, -9223372036854775808, 10**17, -(10**18) + 1, 10**18, 12345678901234567890, None]
REALS = [0, -0, 0.0, -0.0, 1, 1.5, 0.1, -2.5e-7, 1e300, 5e-324, 123456789012345, 1234567890123456, 2**53 + 1, 1e16, "1.0", None]
TIMES = [
    "2022-03-02T17:57:08.589Z", "2022-03-02T17:57:08Z", "1970-01-01T00:00:00.0000005Z", "1970-01-01T00:00:00.0000004Z",
    "1969-12-31T23:59:59.9999995Z", "1969-12-31T23:59:59.9999994999Z", "1960-01-01T00:00:00.123456789-05:30",
    "2020-02-29T23:59:59.999999999+23:59", "2021-02-29T00:00:00Z", "2020-01-01 00:00:00Z", "2020-01-01t00:00:00z",
    "2020-01-01T00:00:00.1234567891Z", "1677-09-21T00:12:44Z", "1678-01-01T00:00:00Z", "2261-12-31T23:59:59.999999999Z",
    "2262-04-11T23:47:16Z", "2020-01-01T24:00:00Z", "2020-01-01T00:00:60Z", "2020-13-01T00:00:00Z", "2020-01-01T00:00:00+24:00",
    "2020-01-01T00:00:00", "١٩٧٠-01-01T00:00:00Z", 1600000000000000000, None,
]
VECTORS = [
    [1, 2, 3], [0.1, -0.2, 3.4028234663852886e38], [3.4028235677973366e38, 0, 0], [1e-46, -1e-46, 0.0], [16777217, 0, 0],
    [1, 2], [1, 2, None], [1, "2", 3], None, [1.0000001, 2.00000001, -0.0],
]

EXACT_NUMBERS = ("1.000000000000000005", "1e-999", "1E+2", "-0.0", "123456789012345678901234567890", "0.10")


def _line(rng: random.Random, i: int) -> str:
    record: dict[str, object] = {"type": rng.choice(["thing", "thing", "thing", "other"]), "id": f"r-{i}"}
    ordinary = {
        "name": lambda: "".join(rng.choice("abcé☃ \"\\\n😀") for _ in range(rng.randint(0, 12))),
        "n": lambda: rng.randint(-(2**31), 2**31 - 1),
        "big": lambda: rng.randint(-(10**18) + 1, 10**18 - 1),
        "x": lambda: rng.choice([rng.uniform(-1e6, 1e6), round(rng.uniform(-100, 100), rng.randint(0, 6)), rng.randint(-999, 999)]),
        "at": lambda: f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02}-{rng.randint(1, 28):02}T{rng.randint(0, 23):02}:"
        f"{rng.randint(0, 59):02}:{rng.randint(0, 59):02}{rng.choice(['', '.' + str(rng.randint(0, 10**9 - 1)).zfill(9)[: rng.randint(1, 9)]])}"
        f"{rng.choice(['Z', '+05:30', '-08:00', '+00:00'])}",
        "emb": lambda: [rng.choice([rng.uniform(-3, 3), rng.randint(-5, 5), rng.gauss(0, 1e30)]) for _ in range(3)],
    }
    for name, pool in (("name", NAMES), ("n", INTS), ("big", LONGS), ("x", REALS), ("at", TIMES), ("emb", VECTORS)):
        roll = rng.random()
        if roll < 0.03:
            record[name] = rng.choice(pool)  # an edge
        elif roll < 0.95:
            record[name] = ordinary[name]()
    if rng.random() < 0.5:
        record["ok"] = rng.choice([True, False, None, 1])
    if rng.random() < 0.5:
        record["labels"] = rng.choice([["a", "b"], {"k": [1, 2.5]}, None, "s"])
    roll = rng.random()
    if roll < 0.03:
        record["unknown_field"] = 1  # _extra and props
    elif roll < 0.05:
        record["schema_version"] = 1
    elif roll < 0.07:
        record["id"] = rng.choice(["", None, "ïd-ünicode", "a\\b", 7])
    elif roll < 0.08:
        record["type"] = rng.choice(["nope", None, 3])
    keys = list(record)
    rng.shuffle(keys)
    text = json.dumps({k: record[k] for k in keys}, ensure_ascii=rng.random() < 0.5)
    if "labels" not in record and rng.random() < 0.05:  # numbers no double holds: _payload keeps them as sent
        text = text[:-1] + ', "labels": [' + ", ".join(EXACT_NUMBERS) + "]}"
    return text if rng.random() < 0.9 else text.replace(",", ", ")


def _stage(pg_url: str, plan: CommitPlan, lines: list[str], direct: bool) -> tuple[StagingWriter, RepeatedLines, int]:
    writer = StagingWriter(pg_url, plan, new_attempt_id())
    repeats = RepeatedLines()
    taken = 0
    try:
        for start in range(0, len(lines), 500):
            batch = lines_batch([line.encode() for line in lines[start : start + 500]], start + 1)
            rows = DirectRows(list(plan.tables)) if direct else None
            out = coerce_batch(batch, plan.spec, repeats, rows)
            writer.write(out, rows)
            taken += sum(rows.count(name) for name in plan.tables) if rows is not None else 0
    finally:
        writer.close()
    return writer, repeats, taken


def _rows(pg_url: str, plan: CommitPlan, template: str, attempt: str) -> list[str]:
    with connect(pg_url) as conn:
        name = attempt_table(template, attempt)
        if conn.execute("SELECT to_regclass(%s)", [f"idem_staging.{name}"]).fetchone() == (None,):
            return []
        return [r for (r,) in conn.execute(
            f"SELECT t::text FROM {staged_ident(name).as_string(conn)} t ORDER BY _pos"  # noqa: S608 (our own identifier)
        ).fetchall()]


@pytest.fixture
def plan(pg_url: str, tmp_path: Path) -> CommitPlan:
    path = write_lines(tmp_path / "f.ndjson", ['{"type":"thing","id":"x","name":"n"}'])
    claimed = claimed_plan(pg_url, TABLES, hash_file(path))
    spec: RecordSpec = replace(claimed.spec, dynamic_values=False)
    assert direct_supported(spec)
    return replace(claimed, spec=spec)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_direct_rows_stage_what_the_arrow_path_stages(pg_url: str, plan: CommitPlan, seed: int) -> None:
    rng = random.Random(seed)
    lines = [_line(rng, i) for i in range(3000)]
    lines += rng.sample(lines, 300)  # exact repeats
    lines += [json.dumps(json.loads(line)) for line in rng.sample(lines, 200)]  # same keys, other spacing
    lines += ["", "not json", "[1]", '{"type":"thing","id":"dup","id":"dup2","name":"n"}']

    arrow, arrow_repeats, _ = _stage(pg_url, plan, lines, direct=False)
    direct, direct_repeats, taken = _stage(pg_url, plan, lines, direct=True)

    assert taken > len(lines) // 3  # the direct path took most ordinary records...
    assert sum(direct.rows.values()) > taken  # ...and left others to the Arrow path
    assert direct.rows == arrow.rows and direct.rejected == arrow.rejected
    assert direct.with_extra == arrow.with_extra and direct.props_fields == arrow.props_fields
    assert direct_repeats.skipped == arrow_repeats.skipped and direct_repeats.unique == arrow_repeats.unique
    assert direct_repeats.keys == arrow_repeats.keys
    for template in [plan.staging_table(name) for name in sorted(plan.tables)] + [plan.rejects_table]:
        expected = _rows(pg_url, plan, template, arrow.attempt)
        assert _rows(pg_url, plan, template, direct.attempt) == expected, template
        assert expected or template == plan.rejects_table


def test_direct_rows_skip_keys_the_table_holds(pg_url: str, tmp_path: Path) -> None:
    """While probing, direct rows whose key is in the table are counted as known, not staged."""
    path = write_lines(tmp_path / "f.ndjson", ['{"type":"thing","id":"x","name":"n"}'])
    plan = claimed_plan(pg_url, TABLES, hash_file(path))
    plan = replace(plan, spec=replace(plan.spec, dynamic_values=False), probe_known=("thing",))
    lines = [json.dumps({"type": "thing", "id": f"k{i}", "name": "n", "n": i}) for i in range(40)]
    with connect(pg_url) as conn:
        conn.execute('CREATE TABLE IF NOT EXISTS idem."thing" (_idempotency_key text COLLATE "C" PRIMARY KEY)')
        conn.execute('TRUNCATE idem."thing"')
    first, _, taken = _stage(pg_url, plan, lines, direct=True)
    assert taken == 40 and first.rows == {"thing": 40}
    held = _rows(pg_url, plan, plan.staging_table("thing"), first.attempt)
    with connect(pg_url) as conn:  # the table holds every other row now
        conn.execute(
            f'INSERT INTO idem."thing" SELECT _idempotency_key FROM {staged_ident(attempt_table(plan.staging_table("thing"), first.attempt)).as_string(conn)} '  # noqa: S608
            "WHERE _pos % 2 = 0"
        )
    again, _, _ = _stage(pg_url, plan, lines, direct=True)
    assert again.known == {"thing": 20} and again.rows == {"thing": 20}
    assert _rows(pg_url, plan, plan.staging_table("thing"), again.attempt) == held[0::2]
