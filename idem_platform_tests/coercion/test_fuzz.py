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
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idem_platform.coercion.records import (
    LINE_MASK,
    UTF8_BOM,
    RecordSpec,
    RepeatedLines,
    coerce_batch,
)
from idem_platform.contract.canonical import InvalidJSON, parse_and_canonicalize, repeated_key
from idem_platform.sources.filedrop import files as files_module
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.filedrop.reader import HEAD_BYTES, read_split
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.fuzz import (
    BASE_SPEC,
    FUZZ,
    STYLES,
    WHOLE_FILES,
    Layout,
    Obj,
    Style,
    any_line,
    dump,
    first_repeat,
    layouts,
    lines_of_a_file,
    records,
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
    if kept.get("_payload") is not None:
        # The line as received, with its line end when it has one: JSON whitespace, which
        # jsonb drops, so the stored _payload is the same wherever the line stands.
        kept["_payload"] = kept["_payload"].rstrip("\r\n")
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


@WHOLE_FILES
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


@WHOLE_FILES
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
