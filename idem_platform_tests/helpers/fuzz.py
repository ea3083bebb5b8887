"""Hypothesis generators of the fuzz tests: JSON-ish lines (repeated keys, odd numbers, lone
surrogates, junk bytes), records of the threat-feed example's catalog, and the layouts a file's
splits and the reader's blocks can take.

They live here, not in a test module, because three test modules draw from them (the fuzz of
the per-record path, the C path's agreement with the Python loop and coercion's properties),
and a test module imported by another would run its tests twice. ``FUZZ`` is the hypothesis
profile of the run: ``ci`` (bounded) unless ``HYPOTHESIS_PROFILE`` names another (``make fuzz``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from idem_platform.coercion.records import UTF8_BOM, RecordSpec
from idem_platform.config import load_config
from idem_platform.contract.catalog import Column, TableSpec
from idem_platform.pipeline.ingest import record_spec
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG

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
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ = settings.get_profile(PROFILE)
# The slowest properties (each example reads or coerces a whole generated file, twice): CI runs
# half the ci profile's examples of them; any other profile (``make fuzz``) runs its full count.
WHOLE_FILES = settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 1)) if PROFILE == "ci" else FUZZ

PREFIX = "0123456789abcdef#L"
CONFIG = load_config(EXAMPLE_CONFIG)
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
