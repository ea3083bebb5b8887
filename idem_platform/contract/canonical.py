"""Canonical JSON: the byte form every record key and request hash is built from.

The contract (DESIGN §2) is Python's ``json.dumps(obj, sort_keys=True,
separators=(",", ":"), allow_nan=False)`` encoded as UTF-8, with integers kept
exact. That costs about 17 µs per threat-feed record, a full core at the target
rate, so :func:`canonical_bytes_from_line` takes an ``orjson`` fast path and
falls back to :mod:`json` whenever the fast output could differ:

* non-ASCII text or DEL (0x7F): ``json`` escapes it, orjson writes it raw (the
  fast path escapes it the same way afterwards);
* a float with magnitude below 1e-4: ``json`` writes ``1e-05`` / ``1e-07`` where
  orjson writes ``0.00001`` / ``1e-7`` (positive exponents print alike);
* anything orjson refuses to parse (lone surrogates, nesting deeper than 1024);
* any ``e+`` in the fast output: orjson parses an integer beyond 64 bits as a
  float (it prints as ``1.2e+22``), so the *value* is re-parsed exactly too.

The guard (:func:`_exact`) looks at the fast output only; it may send a
record down the slow path without need (``0.0000`` inside a string), never the
other way. ``idem_platform_tests/test_canonical.py`` fuzzes the two paths against each
other and the spec vectors pin the result.

Ordinary records never get here on the commit path: ``coercion/_native.c`` writes
their canonical bytes straight from the line's tokens (see ``coercion/native.py``)
and hands every line it doubts to this module, which stays the definition.

Both parsers keep the last value of a key an object repeats, silently;
:func:`repeated_key` finds such a key (the line is then a reject) by comparing
the raw line with its canonical form, and re-parses only when they disagree.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

_ESCAPE_ERRORS = "idem-json-escape"


def _json_escape(error: UnicodeError) -> tuple[str, int]:
    """Codec error handler: non-ASCII characters as JSON ``\\uXXXX`` escapes (surrogate pairs above U+FFFF)."""
    if not isinstance(error, UnicodeEncodeError):  # registered for encoding only
        raise error
    out = []
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out), error.end


codecs.register_error(_ESCAPE_ERRORS, _json_escape)


def _exact(fast: bytes) -> bytes | None:
    """orjson's output made byte-identical to the contract's form, or ``None`` if it cannot be.

    Non-ASCII text and DEL are escaped the way :mod:`json` does (``\\u00e9``,
    surrogate pairs above U+FFFF); they can only occur inside strings, so a
    character-level substitution is exact. orjson writes positive exponents
    exactly like :mod:`json` (``1e+16``); only magnitudes below 1e-4
    (``0.0000…`` or ``…e-N``) need the slow path.
    """
    if not fast.isascii():
        text = fast.decode("utf-8")
        # backslashreplace (C) writes U+0080..U+00FF as \xNN and the rest of the BMP
        # as \uNNNN (json's form). In JSON text "\x" cannot occur except after an
        # escaped backslash ("\\x"); without that, and without astral characters
        # (\UNNNNNNNN), turning every \x into \u00 is exact. Otherwise: the handler.
        escaped = text.encode("ascii", "backslashreplace")
        if b"\\U" in escaped or b"\\\\x" in escaped:
            fast = text.encode("ascii", _ESCAPE_ERRORS)
        else:
            fast = escaped.replace(b"\\x", b"\\u00")
    if 127 in fast:  # an int needle is a memchr; a bytes one a slower search
        fast = fast.replace(b"\x7f", b"\\u007f")
    if (b"e-" in fast and _in_number(fast, b"e-")) or (b"0.0000" in fast and _in_number(fast, b"0.0000")):
        return None
    return fast


_NUMBER_CHARS = frozenset(b"0123456789.")
_BEFORE_VALUE = frozenset(b":,[")


def _in_number(fast: bytes, marker: bytes) -> bool:
    """Whether ``marker`` (``e-`` or ``0.0000``) occurs inside a JSON number of ``fast``.

    In compact JSON a number starts the text or follows ``:``, ``,`` or ``[``: walk
    back from each occurrence over digits, ``.`` and one ``-``. Text inside strings
    may pass (the slow path is then taken without need); a number never escapes.
    Ids such as UUIDs (``…339e-9ecc…``) do not pass: they sent one threat-feed
    record in seven down the slow path, and a regular expression over every record
    with an ``e-`` cost more than the slow path saved. ``bytes.find`` is a memchr.
    """
    at = fast.find(marker)
    while at >= 0:
        if marker[0] == 101 and (at == 0 or fast[at - 1] not in _NUMBER_CHARS):  # "e-" needs a digit before it
            at = fast.find(marker, at + 1)
            continue
        j = at - 1
        while j >= 0 and fast[j] in _NUMBER_CHARS:
            j -= 1
        if j >= 0 and fast[j] == 45:  # "-"
            j -= 1
        if j < 0 or fast[j] in _BEFORE_VALUE:
            return True
        at = fast.find(marker, at + 1)
    return False


class InvalidJSON(ValueError):
    """The text is not JSON the contract accepts (syntax, NaN/Infinity, bad UTF-8)."""


def _reject_constant(token: str) -> Any:
    raise InvalidJSON(f"{token} is not valid JSON")


def canonical_bytes(obj: Any) -> bytes:
    """Serialize ``obj`` exactly like the contract's ``json.dumps`` call, as UTF-8."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode(
            "utf-8"
        )
    except ValueError as exc:  # NaN / Infinity floats
        raise InvalidJSON(str(exc)) from exc


def parse_json_slow(data: bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse with :mod:`json`: exact big integers, NaN/Infinity refused.

    ``object_pairs_hook`` sees every object's pairs before they become a dict
    (:func:`repeated_key` uses it: a dict has already dropped a repeated key).
    """
    if data.endswith(b"\n"):
        # A line's "\n" is no part of it (the last line of a file has none): an error
        # found at the end of the text must read the same either way.
        data = data[:-1]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"invalid UTF-8 at byte {exc.start}") from exc
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=object_pairs_hook)
    except RecursionError as exc:
        raise InvalidJSON("nesting too deep") from exc
    except json.JSONDecodeError as exc:
        raise InvalidJSON(f"{exc.msg} at column {exc.colno}") from exc
    except InvalidJSON:
        raise  # NaN / Infinity, from _reject_constant
    except ValueError as exc:
        # int() refuses more digits than sys.get_int_max_str_digits() (CVE-2020-10735);
        # orjson refuses such a number too, so without this the line would raise.
        raise InvalidJSON(f"an integer has more than {sys.get_int_max_str_digits()} digits (the limit)") from exc


def parse_and_canonicalize(data: bytes) -> tuple[Any, bytes]:
    """Parse one JSON text and return ``(value, canonical bytes)``.

    Raises:
        InvalidJSON: the text is not valid JSON under the contract.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = parse_json_slow(data)
        check_depth(value)
        return value, canonical_bytes(value)
    try:
        fast = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # orjson writes at most MAX_DEPTH levels
        raise InvalidJSON(f"nested deeper than {MAX_DEPTH} levels (the limit)") from None
    if 43 in fast and b"e+" in fast:  # "+" first: a memchr, and most records have none
        # orjson parses an integer beyond 64 bits as a float (printed 1.2e+22):
        # the value itself is wrong, so parse again exactly.
        value = parse_json_slow(data)
        return value, canonical_bytes(value)
    exact = _exact(fast)
    if exact is not None:
        return value, exact
    return value, canonical_bytes(value)


MAX_DEPTH = 254  # arrays and objects inside each other; deeper records are rejects wherever they come from


def check_depth(value: Any) -> None:
    """Refuse a parsed value nested deeper than :data:`MAX_DEPTH` (iteratively: no recursion).

    Raises:
        InvalidJSON: naming the limit.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidJSON(f"nested deeper than {MAX_DEPTH} levels (the limit)")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def canonical_value_bytes(value: Any) -> bytes:
    """Canonical bytes of an already parsed value (a field, not a whole line)."""
    try:
        fast = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return canonical_bytes(value)  # integers beyond 64 bits
    exact = _exact(fast)
    return exact if exact is not None else canonical_bytes(value)


_ESCAPED_COLON = re.compile(rb"\\u003[aA]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RepeatedKey:
    """A key written more than once in one JSON object (parsers keep its last value).

    Attributes:
        key: the repeated key.
        times: how often the object has it.
        path: where it is, from the top: object keys and array indexes, ending with ``key``.
    """

    key: str
    times: int
    path: tuple[str | int, ...]

    def where(self) -> str:
        """The path as JSONPath: ``$.tags[0].id``, ``$["odd key"]``."""
        parts = ["$"]
        for step in self.path:
            if isinstance(step, int):
                parts.append(f"[{step}]")
            elif _NAME.fullmatch(step):
                parts.append(f".{step}")
            else:
                parts.append(f"[{json.dumps(step, ensure_ascii=False)}]")
        return "".join(parts)


def repeated_key(raw: bytes, canonical: bytes) -> RepeatedKey | None:
    """The first key repeated inside one object of ``raw`` (its canonical form given), if any.

    Cheap unless the line may repeat a key: every ``key:value`` pair writes one
    ``:`` and canonical JSON never escapes ``:`` inside strings, so without a
    repeat the raw line and its canonical form hold as many ``:`` (a repeat drops
    at least one pair, hence its ``:``). Only an escaped ``\\u003a`` in the raw
    line, which the canonical form writes as ``:``, can hide one. In both cases
    :mod:`json` parses the line again, showing each object's pairs (:class:`_Pairs`).

    Raises:
        InvalidJSON: the exact parse refuses ``raw`` (it does not, for a text
            :func:`parse_and_canonicalize` accepted).
    """
    if raw.count(58) == canonical.count(58) and (  # ":"
        92 not in raw or _ESCAPED_COLON.search(raw) is None  # "\\": a memchr, unlike b"\\" in raw
    ):
        return None
    return _first_repeat(parse_json_slow(raw, object_pairs_hook=_Pairs.of))


class _Pairs(dict[str, Any]):
    """A parsed object that remembers the first key its text repeated (and how often)."""

    __slots__ = ("repeated", "times")
    repeated: str | None
    times: int

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> _Pairs:
        obj = cls(pairs)
        obj.repeated, obj.times = None, 0
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    obj.repeated, obj.times = key, sum(1 for other, _ in pairs if other == key)
                    break
                seen.add(key)
        return obj


def _first_repeat(value: Any) -> RepeatedKey | None:
    """The first repeat: an object's own before those of what it holds, else in the order written."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Pairs):
            if item.repeated is not None:
                return RepeatedKey(item.repeated, item.times, (*path, item.repeated))
            children: Any = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        inner = [(child, (*path, step)) for step, child in children if isinstance(child, (dict, list))]
        stack.extend(reversed(inner))
    return None


def has_nul(value: Any) -> bool:
    """Whether a parsed JSON value holds a NUL character in any key or string (PostgreSQL
    stores none: such a record is a reject, wherever it came from)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False
