"""Fuzz (hypothesis) of the per-record path an executor runs, without Spark or PostgreSQL.

A staging task reads its split with the file-drop reader, and hands each Arrow
batch to :func:`coerce_batch` (with the task's :class:`RepeatedLines`), which
parses every line (:func:`parse_and_canonicalize`) and turns it into a typed row
or a reject. For any bytes (invalid UTF-8, NUL, lone surrogates, deep nesting,
huge numbers, repeated keys, CRLF, blank lines, BOMs) and for records built from
the threat-feed example's catalog, these tests check that:

* every non-blank line gets exactly one outcome (a row, a reject, or inside one
  task a counted repeat of an earlier row), and nothing raises;
* a line's outcome does not depend on where it stands: first in its file or
  after other lines, wherever the reader's blocks and the file's splits fall;
* the reader hands over every line once, numbered, with its true length;
* parsing agrees with the contract (:mod:`json`): the canonical form is
  ``json.dumps(sort_keys=True)`` of what :mod:`json` reads, and a line is a
  ``duplicate_key`` reject exactly when one of its objects repeats a key.

CI runs the bounded ``ci`` profile; ``make fuzz`` runs ``HYPOTHESIS_PROFILE=fuzz``.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idem_platform.coercion.records import (
    LINE_MASK,
    UTF8_BOM,
    RecordSpec,
    RepeatedLines,
    coerce_batch,
)
from idem_platform.config import load_config
from idem_platform.contract.canonical import InvalidJSON, parse_and_canonicalize, repeated_key
from idem_platform.contract.catalog import Column, TableSpec
from idem_platform.pipeline.ingest import record_spec
from idem_platform.sources.filedrop import files as files_module
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.filedrop.reader import HEAD_BYTES, read_split
from idem_platform_tests.conftest import REPO, lines_batch

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,  # the first examples pay for imports and Arrow's lazy initialisation
    database=None,  # CI starts clean; a failure prints the blob that reproduces it
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "5000")),  # per test: ~10 minutes in all
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PREFIX = "0123456789abcdef#L"
CONFIG = load_config(REPO / "examples" / "threatfeed" / "idem.yaml")
CONNECTOR = CONFIG.connector("threatfeed")
BASE_SPEC = replace(
    record_spec(CONNECTOR, CONFIG.tables_for(CONNECTOR), []), units=((PREFIX, 0),)
)
TYPES = sorted(BASE_SPEC.tables)
UNKNOWN_FIELDS = ["note", "new_field", "Bad Name", "_sys", "props"]


# --- JSON-ish text, written by hand so that it can repeat keys and hold what json.dumps refuses


@dataclass(frozen=True)
class Obj:
    """A JSON object as written: its pairs in order, a key possibly more than once."""

    pairs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Token:
    """Text written as it is: numbers Python would refuse to print, deep nesting, NaN."""

    text: str


@dataclass(frozen=True)
class Style:
    """How a record is written: none of it may change its outcome (beyond UTF-8 validity)."""

    ascii: bool
    spaced: bool
    escape_colons: bool  # ":" inside strings written as \\u003a


def dump(value: Any, style: Style) -> str:
    """JSON text of ``value`` (lone surrogates stay lone; encode with ``surrogatepass``)."""
    if isinstance(value, Token):
        return value.text
    if isinstance(value, Obj):
        colon = ": " if style.spaced else ":"
        items = (f"{dump(key, style)}{colon}{dump(item, style)}" for key, item in value.pairs)
        return "{" + (", " if style.spaced else ",").join(items) + "}"
    if isinstance(value, list):
        return "[" + (", " if style.spaced else ",").join(dump(item, style) for item in value) + "]"
    text = json.dumps(value, ensure_ascii=style.ascii)
    return text.replace(":", "\\u003a") if style.escape_colons and isinstance(value, str) else text


def first_repeat(value: Any, path: tuple[str | int, ...] = ()) -> tuple[str, int, tuple[str | int, ...]] | None:
    """The repeat a reader of ``value``'s text should report (the oracle: no parser involved).

    ``(key, times, path)`` of the first key an object repeats, the object itself before
    what it holds, in the order written; a repeated key keeps its first place and last
    value, as every JSON parser here does. An object inside a dropped value needs no
    look: the object holding that value repeats a key already.
    """
    if isinstance(value, Obj):
        seen: set[str] = set()
        for key, _ in value.pairs:
            if key in seen:
                return key, sum(other == key for other, _ in value.pairs), (*path, key)
            seen.add(key)
        children: Any = dict(value.pairs).items()
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return None
    for step, child in children:
        found = first_repeat(child, (*path, step))
        if found is not None:
            return found
    return None


TOKENS = st.sampled_from(
    [
        "1" * 4301,  # more digits than int() takes
        "-" + "9" * 4300,
        "123456789012345678901234567890",
        "1e400",
        "-1e400",
        "1E+16",
        "1e-7",
        "0.00001",
        "-0",
        "NaN",
        "Infinity",
        "[" * 252 + "1" + "]" * 252,  # with the record and its field: 254 levels, the limit
        "[" * 253 + "{}" + "]" * 253,  # 255: a reject
        "[" * 1100 + "]" * 1100,  # past orjson's own limit
    ]
).map(Token)
ODD_STRINGS = st.sampled_from(
    ["", "x:y", "::", "é中😀", "\ud800", "\udc00x", "a\x00b", "\x7f", "0.0000", "e+5", "\\u003a", "\r\n"]
)
ODD_KEYS = st.sampled_from(["a", "b", "a:", "id", "type", "name", "é", "Bad Key", "\ud800", "n\x00l", ""])
CLEAN_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=8)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([2**31, -(2**31) - 1, 2**63, 10**30, 1_700_000_000_000_000_000, 3.4028235e38, 1e-5, -0.0]),
)


def json_values(strings: st.SearchStrategy[str], keys: st.SearchStrategy[str], *, tokens: bool) -> st.SearchStrategy[Any]:
    """Any JSON value (objects may repeat keys: ``keys`` is a small alphabet)."""
    scalars = st.one_of(st.none(), st.booleans(), NUMBERS, strings, *([TOKENS] if tokens else []))
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(st.tuples(keys, inner), max_size=4).map(lambda pairs: Obj(tuple(pairs))),
        ),
        max_leaves=12,
    )


ANY_VALUE = json_values(st.one_of(ODD_STRINGS, st.text(max_size=6)), st.one_of(ODD_KEYS, st.text(max_size=3)), tokens=True)
CLEAN_VALUE = json_values(CLEAN_TEXT, st.sampled_from(["a", "b", "c", "k:v"]), tokens=False)


@st.composite
def rfc3339(draw: st.DrawFn) -> str:
    """Mostly valid RFC 3339 text, near the edges of timestamp[ns] and of the calendar."""
    year = draw(st.sampled_from([1677, 1678, 1970, 2024, 2026, 2262, 2263]) | st.integers(1, 9999))
    month, day = draw(st.integers(1, 12)), draw(st.integers(1, 31))
    hour, minute, second = draw(st.integers(0, 24)), draw(st.integers(0, 60)), draw(st.integers(0, 60))
    fraction = draw(st.sampled_from(["", ".5", ".123456789", ".1234567891234", ".854775807", ".854775808"]))
    zone = draw(st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-23:59", "+24:00"]))
    separator = draw(st.sampled_from(["T", "t", " "]))
    return f"{year:04d}-{month:02d}-{day:02d}{separator}{hour:02d}:{minute:02d}:{second:02d}{fraction}{zone}"


def good_value(column: Column) -> st.SearchStrategy[Any]:
    """Values a column of this type should mostly take, with its edge cases."""
    kind = column.type.kind
    if kind == "int":
        return st.integers(-(2**31) - 1, 2**31)
    if kind == "long":
        return st.integers(-(2**63) - 1, 2**63)
    if kind == "real":
        return st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**60), 2**60))
    if kind == "bool":
        return st.booleans()
    if kind == "string":
        return CLEAN_TEXT
    if kind == "timestamp":
        return st.one_of(rfc3339(), st.integers(-(2**63) - 1, 2**63))
    if kind == "vector":
        element = st.one_of(st.floats(-3.5e38, 3.5e38, allow_nan=False), st.integers(-1000, 1000))
        assert column.type.dim is not None
        return st.lists(element, min_size=column.type.dim - 1, max_size=column.type.dim + 1)
    return CLEAN_VALUE


@st.composite
def records(draw: st.DrawFn) -> Obj:
    """A record of the example's catalog: clean (likely accepted) or with any value anywhere."""
    clean = draw(st.booleans())
    values = CLEAN_VALUE if clean else ANY_VALUE
    record_type = draw(st.sampled_from(TYPES) if clean else st.one_of(st.sampled_from(TYPES), values))
    pairs: list[tuple[str, Any]] = []
    if not clean or draw(st.integers(0, 9)):
        pairs.append(("type", record_type))
    if draw(st.integers(0, 4)):
        ident = st.one_of(st.text("abc-_:é", max_size=6), st.integers(), st.just(""))
        pairs.append(("id", draw(ident if clean else st.one_of(ident, values))))
    table = BASE_SPEC.tables.get(record_type) if isinstance(record_type, str) else None
    columns = draw(st.lists(st.sampled_from(table.columns), unique_by=lambda c: c.name)) if table else []
    for column in columns:
        pairs.append((column.name, draw(good_value(column) if clean else st.one_of(good_value(column), values))))
    for name in draw(st.lists(st.sampled_from(UNKNOWN_FIELDS), unique=True, max_size=2)):
        pairs.append((name, draw(values)))
    pairs = draw(st.permutations(pairs))
    if pairs and not draw(st.integers(0, 5)):  # now and then, a key twice at the top
        key = draw(st.sampled_from([key for key, _ in pairs]))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(values)))
    return Obj(tuple(pairs))


STYLES = st.builds(Style, ascii=st.booleans(), spaced=st.booleans(), escape_colons=st.booleans())
structured_lines = st.builds(lambda record, style: dump(record, style).encode("utf-8", "surrogatepass"), records(), STYLES)

FRAGMENTS = [
    b"{", b"}", b"[", b"]", b'"', b":", b",", b" ", b"\t", b"\r", b"\x0b", b"\x00", b"\\",
    b"\\u0000", b"\\ud800", b"\\ud83d\\ude00", b"\\u003a", b"\\u003A", UTF8_BOM, b"\xff",
    b"\xed\xa0\x80", b"\xc3\xa9", b"\x7f", b"NaN", b"1e400", b"0.00001", b"9" * 25, b"true",
    b"null", b'"id"', b'"type"', b'"name"', b'"indicator"', b'"malware"', b'"x"',
    b'{"type":"malware","name":"m"', b'{"type":"indicator","id":"i","name":"n"}',
]
junk_lines = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=6)), max_size=12).map(b"".join)
any_line = st.one_of(junk_lines, structured_lines).map(lambda line: line.replace(b"\n", b" "))
blank_lines = st.sampled_from([b"", b" ", b"\r", b" \t\r", b"\x0b\x0c"])
lines_of_a_file = st.lists(st.one_of(any_line, blank_lines), max_size=12)


@dataclass(frozen=True)
class Layout:
    """Where a file's splits and the reader's blocks fall, and the record spec's knobs."""

    split_bytes: int
    chunk_bytes: int
    block_bytes: int
    max_line_bytes: int
    missing_id: str
    dynamic_values: bool
    evolved: bool

    def spec(self) -> RecordSpec:
        tables: dict[str, TableSpec] = BASE_SPEC.tables
        if self.evolved:  # a string column added by an earlier run's evolution
            tables = {name: table.with_evolved(["note"]) for name, table in tables.items()}
        return replace(
            BASE_SPEC, tables=tables, max_line_bytes=self.max_line_bytes,
            missing_id=self.missing_id, dynamic_values=self.dynamic_values,
        )


layouts = st.builds(
    Layout,
    split_bytes=st.sampled_from([1, 7, 64, 1 << 20]),
    chunk_bytes=st.sampled_from([5, 4096]),
    block_bytes=st.sampled_from([1, 3, 17, 64, 4096]),
    max_line_bytes=st.sampled_from([64, 100, 1 << 20]),
    missing_id=st.sampled_from(["position", "content", "reject"]),
    dynamic_values=st.booleans(),
    evolved=st.booleans(),
)


# --- the harness: a file on disk, read and coerced as a staging task does


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def read_file(directory: Path, data: bytes, layout: Layout) -> Iterator[pa.RecordBatch]:
    """Hash ``data`` as a dropped file (small splits allowed) and read every split."""
    path = directory / f"{uuid.uuid4().hex}.ndjson"
    path.write_bytes(data)
    try:
        with mock.patch.object(files_module, "MIN_SPLIT_BYTES", 1):
            file = hash_file(path, max_split_bytes=layout.split_bytes, chunk_bytes=layout.chunk_bytes)
        for split in file.splits:
            yield from read_split(file, split, 0, max_line_bytes=layout.max_line_bytes, block_bytes=layout.block_bytes)
    finally:
        path.unlink()


def coerce(batches: Iterator[pa.RecordBatch], spec: RecordSpec, repeats: RepeatedLines | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for batch in batches:
        out = coerce_batch(batch, spec, repeats)
        assert out.schema == spec.output_schema()
        rows.extend(out.to_pylist())
    return rows


def file_lines(data: bytes) -> list[bytes]:
    """The reference cut: a file's lines without their ``\\n`` (no last empty line)."""
    if not data:
        return []
    lines = data.split(b"\n")
    return lines[:-1] if data.endswith(b"\n") else lines


def is_blank(line: bytes) -> bool:
    return not line or line.isspace()


def line_of(row: dict[str, Any]) -> int:
    return row["_pos"] & LINE_MASK


def outcome(row: dict[str, Any]) -> dict[str, Any]:
    """A row without what depends on its position by design (its position, and an id made of it)."""
    kept = {name: value for name, value in row.items() if name not in ("_pos", "_source")}
    if row["_external_id"] is not None and row["_external_id"] == row["_source"]:
        kept["_external_id"] = kept["_idempotency_key"] = "<position>"
    return kept


def contract(text: bytes) -> bytes:
    """The contract's canonical form of a JSON text, straight from :mod:`json`."""
    value = json.loads(text.decode("utf-8"))
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def reference_repeat(text: bytes) -> bool:
    """Whether :mod:`json`, shown every object's pairs, sees a key twice."""
    found = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        found.append(len(set(keys)) != len(keys))
        return dict(pairs)

    json.loads(text.decode("utf-8"), object_pairs_hook=hook)
    return any(found)


def check_row(row: dict[str, Any], line: bytes, spec: RecordSpec) -> None:
    """One output row is coherent: a reject with reasons, or a typed, keyed row of the contract."""
    if row["_errors"] is not None:
        reasons = json.loads(row["_errors"])
        assert reasons and all(set(reason) == {"field", "rule", "message"} for reason in reasons), reasons
        assert row["_record_type"] is None and row["_idempotency_key"] is None and row["_raw"] is not None
        assert row["_raw_length"] == len(line)
        if any(reason["rule"] == "duplicate_key" for reason in reasons):
            assert reference_repeat(line), line
        return
    assert row["_record_type"] in spec.tables and row[row["_record_type"]] is not None
    assert row["_idempotency_key"].startswith(f"{spec.connector}:{row['_record_type']}:")
    # _payload: the line as received (its line end is JSON whitespace); the hash (and key): the contract's form
    assert row["_payload"].encode().rstrip(b"\r\n") == line.rstrip(b"\r\n"), line
    assert row["_content_hash"] == hashlib.sha1(contract(line)).hexdigest(), line
    assert not reference_repeat(line), line


# --- the properties


@FUZZ
@given(data=st.binary(max_size=300) | lines_of_a_file.map(b"\n".join), layout=layouts)
def test_the_reader_hands_over_every_line_once_with_its_true_length(scratch: Path, data: bytes, layout: Layout) -> None:
    got = [
        (number, raw, length)
        for batch in read_file(scratch, data, layout)
        for number, raw, length in zip(*(batch.column(c).to_pylist() for c in ("_offset", "_raw", "_raw_length")), strict=True)
    ]
    expected = file_lines(data)
    assert [number for number, _, _ in got] == list(range(1, len(expected) + 1))
    for (_, raw, length), line in zip(got, expected, strict=True):
        assert length == len(line)
        if raw.removesuffix(b"\n") != line:  # only a line over the limit comes as its head
            assert len(line) > layout.max_line_bytes + len(UTF8_BOM) and raw == line[:HEAD_BYTES]


@FUZZ
@given(line=any_line)
def test_parsing_any_bytes_gives_the_contract_form_or_invalid_json(line: bytes) -> None:
    try:
        _, canonical = parse_and_canonicalize(line)
    except InvalidJSON:
        return
    assert canonical == contract(line)
    assert (repeated_key(line, canonical) is not None) == reference_repeat(line)


@FUZZ
@given(record=records(), style=STYLES)
def test_a_record_repeating_a_key_is_a_reject_naming_it(record: Obj, style: Style) -> None:
    line = dump(record, style).encode("utf-8", "surrogatepass")
    (row,) = coerce_batch(lines_batch([line]), BASE_SPEC).to_pylist()
    check_row(row, line, BASE_SPEC)
    expected = first_repeat(record)
    if expected is None:
        return
    assert row["_errors"] is not None
    (reason, *more) = json.loads(row["_errors"])
    if reason["rule"] in ("json", "nul", "surrogate"):
        return  # a line-level reason found before repeats are looked for
    key, times, path = expected
    assert (reason["rule"], reason["field"], more) == ("duplicate_key", path[0], [])
    twice = "twice" if times == 2 else f"{times} times"
    shown = json.dumps(key, ensure_ascii=False)
    if len(shown) <= 60:
        assert reason["message"].startswith(f"object has the key {shown} {twice} (at $"), reason


@FUZZ
@given(lines=lines_of_a_file, bom=st.booleans(), newline_at_end=st.booleans(), layout=layouts)
def test_every_non_blank_line_gets_exactly_one_outcome(
    scratch: Path, lines: list[bytes], bom: bool, newline_at_end: bool, layout: Layout
) -> None:
    """As a staging task runs: batches of one split after another, one task's repeat memory."""
    data = (UTF8_BOM if bom else b"") + b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    spec = layout.spec()
    repeats = RepeatedLines()
    rows = coerce(read_file(scratch, data, layout), spec, repeats)
    as_read = file_lines(data)
    lines_1_on = {n: line.removeprefix(UTF8_BOM) if n == 1 else line for n, line in enumerate(as_read, 1)}
    expected = {n: line for n, line in lines_1_on.items() if not is_blank(line)}
    numbers = [line_of(row) for row in rows]
    assert len(numbers) == len(set(numbers)) and set(numbers) <= set(expected)
    for row in rows:
        check_row(row, expected[line_of(row)], spec)
    counted = set(expected) - set(numbers)  # repeats of earlier rows of the task: counted, not staged
    assert sum(repeats.skipped.values()) == len(counted)
    staged = {row["_idempotency_key"] for row in rows if row["_errors"] is None}
    for n in counted:
        (alone,) = coerce_batch(lines_batch([as_read[n - 1]], first_line=n), spec).to_pylist()
        assert alone["_errors"] is None and alone["_idempotency_key"] in staged


@FUZZ
@given(line=any_line, others=lines_of_a_file.filter(bool), layout=layouts, bom=st.booleans(), newline_at_end=st.booleans())
def test_a_line_gets_the_same_outcome_wherever_it_stands(
    scratch: Path, line: bytes, others: list[bytes], layout: Layout, bom: bool, newline_at_end: bool
) -> None:
    """First in a file (after the file's BOM, if any) or last after other lines: the same outcome.

    A line that itself starts with a BOM can only be line 1 after the file's own BOM
    (otherwise that BOM would be the file's)."""
    spec = layout.spec()
    first = (UTF8_BOM if bom or line.startswith(UTF8_BOM) else b"") + b"\n".join([line, *others])
    last = b"\n".join([*others, line]) + (b"\n" if newline_at_end else b"")
    read_first = outcomes_by_line(coerce(read_file(scratch, first, layout), spec, None))
    read_last = outcomes_by_line(coerce(read_file(scratch, last, layout), spec, None))
    assert read_first.get(1) == read_last.get(len(others) + 1)
    assert (read_first.get(1) is None) == is_blank(line)


def outcomes_by_line(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {line_of(row): outcome(row) for row in rows}


# --- regressions the fuzz found, and the duplicate-key rule's reasoning, pinned


def run(lines: list[bytes], spec: RecordSpec = BASE_SPEC) -> list[dict[str, Any]]:
    return coerce_batch(lines_batch(lines), spec).to_pylist()


def reasons(row: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    return [(r["field"], r["rule"], r["message"]) for r in json.loads(row["_errors"] or "[]")]


GOOD = '{"type":"malware","name":"m","id":"x"'


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ('{"type":"malware","id":"a","id":"b","name":"m"}', "id", 'object has the key "id" twice (at $.id)'),
        (GOOD + ',"labels":[1,{"k":{"a":1,"a":2}}]}', "labels", 'object has the key "a" twice (at $.labels[1].k.a)'),
        (GOOD + ',"notes":{"x":1,"x":2,"x":3}}', "notes", 'object has the key "x" 3 times (at $.notes.x)'),
        (GOOD + ',"Bad Key":{"é":1,"é":2}}', "Bad Key", 'object has the key "é" twice (at $["Bad Key"]["é"])'),
        # \u003a is ":": the two keys are one, though the colons of line and canonical form agree
        (GOOD + ',"t":{"a:":1,"a\\u003a":"\\u003a"}}', "t", 'object has the key "a:" twice (at $.t["a:"])'),
        (GOOD + ',"n":1,"n":"\\u003a"}', "n", 'object has the key "n" twice (at $.n)'),
    ],
)
def test_a_repeated_key_is_a_reject_naming_the_key_and_where(line: str, field: str, message: str) -> None:
    (row,) = run([line.encode()])
    assert reasons(row) == [(field, "duplicate_key", message)]


@pytest.mark.parametrize(
    "line",
    [
        GOOD + ',"note":"a:b::c","k:v":{"x:":"::"}}',  # colons inside strings are no pairs
        GOOD + ',"note":"\\u003a","t":{"a\\u003a":1,"a":2}}',  # escaped colons, distinct keys
        GOOD + ',"labels":[{"a":1},{"a":2}],"tags":{"a":{"a":1}}}',  # same key in other objects
    ],
)
def test_colons_and_keys_of_other_objects_are_not_repeats(line: str) -> None:
    (row,) = run([line.encode()])
    assert row["_errors"] is None, reasons(row)


def test_an_integer_past_the_digit_limit_is_a_reject_not_a_crash() -> None:
    """Found by the fuzz: :mod:`json` raised a bare ValueError (int() refuses 4300+ digits)
    for a number orjson had refused too, and the whole task failed."""
    (row,) = run([(GOOD + ',"n":' + "1" * 4301 + "}").encode()])
    assert reasons(row)[0][1] == "json" and "more than 4300 digits" in reasons(row)[0][2]


def test_a_file_bom_is_no_part_of_line_1() -> None:
    """Found by the fuzz: a BOM then spaces on line 1 was a JSON reject (blank elsewhere), and the
    BOM counted against max_line_bytes and showed in the reject's raw text."""
    spec = replace(BASE_SPEC, max_line_bytes=64)
    line = ('{"type":"malware","name":"' + "m" * 36 + '"}').encode()
    assert len(line) == 64
    assert run([UTF8_BOM + b" \r", b" "], spec) == []
    (first,) = run([UTF8_BOM + line], spec)
    assert first["_errors"] is None
    (bad,) = run([UTF8_BOM + b"nope\r"], spec)
    assert (bad["_raw"], bad["_raw_length"]) == ("nope", 5)


def test_a_too_long_line_reads_the_same_whole_or_as_its_head(tmp_path: Path) -> None:
    """Found by the fuzz: with max_line_bytes under RAW_CAP, a too-long line that straddled two
    of the reader's blocks kept only the bytes of the first block as its raw text; and a head
    ending in "\\r" lost it, though the same bytes of a whole line kept it."""
    spec = replace(BASE_SPEC, max_line_bytes=64)
    long = b"x" * 100
    crlf = b"y" * 4095 + b"\r" + b"z" * 10
    layouts = [Layout(1 << 20, 4096, block, 64, "position", True, False) for block in (4096, 80, 7)]
    seen = []
    for layout in layouts:
        rows = coerce(read_file(tmp_path, b"\n".join([long, crlf, b"a" * 70 + b"\r"]), layout), spec, None)
        seen.append([(row["_raw"], row["_raw_length"]) for row in rows])
    assert seen[0] == seen[1] == seen[2]
    assert seen[0] == [("x" * 100, 100), ("y" * 4095 + "\r", 4106), ("a" * 70, 71)]
