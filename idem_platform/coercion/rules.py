"""The per-record rules, each written once: what a record's facts make it.

A line's facts are its bytes, its parsed record (or the parse's error) and the SHA-1 of its
canonical bytes (DESIGN §2); the C path (``_native.c``, see :mod:`~idem_platform.coercion.native`)
only ever finds facts, faster. Everything a line *becomes* is decided here, from its facts,
the same on both paths: which record type it is routed to, its external id, its schema
version (current, upgraded through the migrations, or a reject), what its unknown top-level
fields do under its type's schema contract, and the reject (rule and message) of every line
that breaks one. The record key is :func:`idem_platform.contract.keys.record_key`; repeats
(of a line, or of a key) are :class:`idem_platform.coercion.records.RepeatedLines`' memories,
applied in :mod:`~idem_platform.coercion.records` in input order.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from idem_platform.coercion.converters import json_kind
from idem_platform.contract.canonical import (
    InvalidJSON,
    RepeatedKey,
    canonical_value_bytes,
    has_nul,
    parse_and_canonicalize,
    repeated_key,
)
from idem_platform.contract.catalog import BINLOG_FILE_NUMBER, is_safe_column_name
from idem_platform.contract.keys import ext_id_text
from idem_platform.migrations import MigrationFailed, MigrationSource

# Schema contracts (DESIGN §3): what a record's unknown top-level fields do.
EVOLVE, STRICT, DROP = "evolve", "strict", "drop"
MAX_UNKNOWN_REASONS = 32  # a strict reject names at most this many unknown fields, then counts the rest
_NUL_ESCAPE = b"\\u0000"
_SURROGATE_ESCAPE = b"\\ud"  # canonical JSON escapes surrogates (pairs, and lone ones) as \udxxx
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Reject(Exception):
    """A line that breaks a rule: its reasons (``field``, ``rule``, ``message`` each)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors


def line_error(rule: str, message: str, field_name: str | None = None) -> Reject:
    return Reject([{"field": field_name, "rule": rule, "message": message}])


def parsed(raw: bytes, noun: str) -> tuple[dict[str, Any], bytes]:
    """A non-blank line's record and canonical bytes, or the reject every check of the
    contract words (not JSON, not an object, NUL, a lone surrogate, a repeated key)."""
    try:
        # Trailing "\r\n" is JSON whitespace: no need to strip it first.
        record, canonical = parse_and_canonicalize(raw)
    except InvalidJSON as exc:
        raise line_error("json", f"{noun} is not valid JSON: {exc}") from None
    if type(record) is not dict:
        raise line_error("not_object", f"{noun} is {json_kind(record)}, not a JSON object")
    # Both escapes start with a backslash, which most records' canonical form lacks:
    # ``92 in`` is a memchr, a bytes needle a slower search (~0.5 µs each).
    if 92 in canonical:
        if _NUL_ESCAPE in canonical and has_nul(record):
            raise line_error("nul", "record contains a NUL character (\\u0000), which PostgreSQL cannot store")
        if _SURROGATE_ESCAPE in canonical and (lone := lone_surrogate(record)) is not None:
            raise line_error(
                "surrogate",
                f"record contains a lone surrogate (\\u{ord(lone):04x}): not Unicode text, which "
                "PostgreSQL cannot store",
            )
    # repeated_key's first test, widened to any backslash and inlined: a call per
    # record would cost as much as the counts; ``92 in`` is a memchr, ``b"\\" in`` not.
    if raw.count(58) != canonical.count(58) or 92 in raw:  # ":" and "\"
        repeated = repeated_key(raw, canonical)
        if repeated is not None:
            raise repeated_key_error(repeated)
    return record, canonical


def repeated_key_error(repeated: RepeatedKey) -> Reject:
    """A repeated key is a reject, not data: a parser would keep one of the values
    silently, and which one is the parser's choice, not the producer's."""
    key = json.dumps(repeated.key, ensure_ascii=False)
    if len(key) > 62:
        key = key[:60] + "…\""
    where = repeated.where()
    if len(where) > 200:
        where = where[:100] + "…" + where[-99:]
    times = "twice" if repeated.times == 2 else f"{repeated.times} times"
    return line_error(
        "duplicate_key", f"object has the key {key} {times} (at {where})", str(repeated.path[0])
    )


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any key or string of a parsed value (JSON allows
    ``"\\ud800"``; Unicode text, UTF-8 and PostgreSQL do not)."""
    if isinstance(value, str):
        found = _LONE_SURROGATE.search(value)
        return found.group() if found else None
    if isinstance(value, dict):
        for key, item in value.items():
            found_in = lone_surrogate(key) or lone_surrogate(item)
            if found_in is not None:
                return found_in
    elif isinstance(value, list):
        for item in value:
            found_in = lone_surrogate(item)
            if found_in is not None:
                return found_in
    return None


def route(record: dict[str, Any], type_field: str | None, record_types: dict[str, Any]) -> str:
    """The record type a record is routed to by its ``type_field``, or the reject."""
    if type_field is None:  # RecordSpec routes by field only when the connector names one
        raise ValueError("routing by field needs a record_type_field")
    value = record.get(type_field)
    if type(value) is str and value in record_types:
        return value
    if value is None:
        raise line_error(
            "record_type",
            f"field '{type_field}' is {'null' if type_field in record else 'missing'}; "
            "it names the record's type",
            type_field,
        )
    known = ", ".join(sorted(record_types))
    raise line_error(
        "record_type",
        f"field '{type_field}': {json.dumps(value, ensure_ascii=False)[:60]} is not a record type "
        f"of this connector ({known})",
        type_field,
    )


def ext_id(record: dict[str, Any], id_field: str, missing_id: str, source: str, digest: str) -> str:
    """A record's external id: its id field as text; when that is missing, null or empty,
    its position or its content hash (``missing_id``), or the reject."""
    try:
        text = ext_id_text(record.get(id_field))
    except TypeError as exc:
        raise line_error("id", f"field '{id_field}' {exc}", id_field) from None
    if text:  # an empty string names nothing: it counts as missing, like null
        return text
    if missing_id == "position":
        return source
    if missing_id == "content":
        return digest
    raise line_error(
        "id", f"field '{id_field}' is missing, null or empty and missing_id is 'reject'", id_field
    )


def positional(record: dict[str, Any], id_field: str, missing_id: str) -> bool:
    """Whether the record is keyed by its position: such a record is never a repeat, its
    key differs by construction (so its line is not remembered)."""
    return missing_id == "position" and record.get(id_field) in (None, "")


def stated_version(record: dict[str, Any], version_field: str, declared: int | None, current: int) -> Any:
    """The schema version a record is at when it is not its table's ``current`` one (it is
    upgraded or rejected: :func:`upgrade`), else ``None``. A record states it in its
    ``version_field``; one that states none (or ``null``) is at the connector's ``declared``
    version, or, with none declared, the current one."""
    version = record.get(version_field)
    if version is None:
        return declared if declared is not None and not (declared == current and type(declared) is int) else None
    return None if type(version) is int and version == current else version


def upgrade(
    record: dict[str, Any], record_type: str, version: Any, current: int, version_field: str,
    migrations: MigrationSource,
) -> tuple[int, dict[str, Any], str]:
    """A record at a version other than its table's current one: ``(its version, the record
    upgraded through the migrations, its canonical JSON)``, or a reject (rule ``schema_version``
    or ``migration``). The version field is a system field: the migrations never see it, and
    the upgraded record does not hold it."""
    name = version_field
    stated = record.get(name) is not None
    if type(version) is not int or version < 1:
        shown = json.dumps(version, ensure_ascii=False)[:60]
        raise line_error("schema_version", f"field '{name}': {shown} is not a schema version (an integer >= 1)", name)
    if version > current:
        who = "record says" if stated else "connector declares"
        raise line_error("schema_version", f"{who} schema_version {version} but {record_type} is at {current}", name)
    try:
        result = migrations.chains().upgrade(record_type, {k: v for k, v in record.items() if k != name}, version)
        result.pop(name, None)
        canonical = canonical_value_bytes(result)
    except MigrationFailed as exc:
        raise line_error("migration", str(exc)) from None
    except (TypeError, ValueError) as exc:  # the migration returned something JSON cannot hold
        raise line_error("migration", f"{record_type} upgraded from v{version} is not JSON: {exc}") from None
    if (_NUL_ESCAPE in canonical and has_nul(result)) or (
        _SURROGATE_ESCAPE in canonical and lone_surrogate(result) is not None
    ):
        raise line_error("migration", f"{record_type} upgraded from v{version} holds text PostgreSQL cannot store")
    return version, result, canonical.decode("utf-8")


def unknown_fields(
    record: dict[str, Any], known: frozenset[str], contract: str, record_type: str
) -> tuple[str | None, str | None, list[dict[str, Any]] | None]:
    """What a record's unknown top-level fields (not in ``known``) do under its type's
    schema contract: ``(_extra, _props, None)`` under ``evolve``; under ``strict``,
    ``(None, None, the reasons that make it a reject)``; nothing under ``drop`` (they stay
    in ``_payload`` only) or when it has none."""
    if contract == DROP or record.keys() <= known:
        return None, None, None
    if contract == STRICT:
        return None, None, unknown_field_errors(record, known, record_type)
    extra, props = unknown_columns(record, known)
    return extra, props, None


def unknown_columns(record: dict[str, Any], skip: frozenset[str]) -> tuple[str | None, str | None]:
    """Fields no column declares: evolvable names (rendered as text) vs ``props`` (kept as JSON).

    An evolvable field's JSON ``null`` stays ``null`` in ``_extra`` (the apply's
    ``_extra ->> name`` makes it SQL NULL), as a declared ``string`` column stores it: the
    text ``'null'`` would read as the string ``"null"``, which ``IS NULL`` misses and
    ``idem retype`` counts as a failed cast.
    """
    extra: dict[str, str | None] = {}
    props: dict[str, Any] = {}
    for name in record.keys() - skip:
        value = record[name]
        if is_safe_column_name(name):
            extra[name] = value if type(value) is str or value is None else canonical_value_bytes(value).decode("ascii")
        else:
            props[name] = value
    return (
        orjson.dumps(extra, option=orjson.OPT_SORT_KEYS).decode() if extra else None,
        canonical_value_bytes(props).decode("ascii") if props else None,
    )


def unknown_field_errors(record: dict[str, Any], skip: frozenset[str], record_type: str) -> list[dict[str, Any]]:
    """A strict record type's reasons: one per unknown field, in name order (at most
    :data:`MAX_UNKNOWN_REASONS`, then one that counts the rest)."""
    names = sorted(record.keys() - skip)
    errors: list[dict[str, Any]] = [
        {
            "field": name,
            "rule": "unknown_field",
            "message": f"field '{name if len(name) <= 64 else name[:60] + '…'}': not in the catalog of "
            f"{record_type} (schema_contract: strict)",
        }
        for name in names[:MAX_UNKNOWN_REASONS]
    ]
    if len(names) > MAX_UNKNOWN_REASONS:
        errors.append({
            "field": None,
            "rule": "unknown_field",
            "message": f"{len(names) - MAX_UNKNOWN_REASONS} more fields are not in the catalog of "
            f"{record_type} (schema_contract: strict)",
        })
    return errors


# Debezium change events (``format: debezium``): what an event's version is.
DEBEZIUM_OP = "__debezium_op"  # the event's op, beside the row image in the record the batch types
DEBEZIUM_OPS = ("c", "u", "r", "d")


def debezium_envelope(record: dict[str, Any]) -> dict[str, Any]:
    """The change event inside the JSON converter's ``{schema, payload}`` wrapper, or the
    record itself (no wrapper). The same rule reads ``_payload`` in PostgreSQL
    (:func:`idem_platform.postgres.current.debezium_envelope_sql`)."""
    payload = record.get("payload")
    return payload if "schema" in record and isinstance(payload, dict) else record


_BIGINT_END = 1 << 63  # the state keeps each part of a position as a bigint
_BINLOG_FILE_NUMBER = re.compile(BINLOG_FILE_NUMBER)


def _position_part(value: object, name: str, what: str) -> int:
    """``value`` (``source.<name>``) as a part of a position, or the reject naming the field."""
    if type(value) is not int or not 0 <= value < _BIGINT_END:
        raise line_error("position", f"source.{name} is missing or not an integer from 0 to 2^63-1: {what}", f"source.{name}")
    return value


def debezium_position(source: object) -> dict[str, Any]:
    """The source position of a change event, as its version names it, or the reject.

    ``{"lsn": n}``: ``source.lsn`` of the PostgreSQL connector (the order ``[n]``);
    ``{"binlog": {"file", "pos", "row"}}``: the MySQL connector's binlog coordinates, ordered
    by the number that ends the file name (``mysql-bin.000010``: 10; past ``.999999`` MySQL
    writes seven digits, so never as text), then ``pos``, then ``row`` (the row of a
    multi-row event; none: 0). ``gtid`` and the timestamps are not the position. The fold
    reads the same fields from ``_payload`` (:func:`idem_platform.postgres.current.fold`):
    an event with a non-null ``lsn`` is ordered by it, any other by its binlog coordinates."""
    fields = source if isinstance(source, dict) else {}
    lsn = fields.get("lsn")
    if lsn is not None or ("file" not in fields and "pos" not in fields):
        what = (
            "idem orders Debezium events by source.lsn (PostgreSQL connector) or by source.file, source.pos and "
            "source.row (MySQL connector)"
        )
        return {"lsn": _position_part(lsn, "lsn", what)}
    name = fields.get("file")
    if type(name) is not str or _BINLOG_FILE_NUMBER.search(name) is None:
        raise line_error(
            "position",
            "source.file is missing or not a binlog file name ending in its number (mysql-bin.000003): idem orders "
            "the MySQL connector's events by that number, source.pos and source.row",
            "source.file",
        )
    pos = _position_part(fields.get("pos"), "pos", "the event's position in its binlog file (MySQL connector)")
    row = fields.get("row")
    row = 0 if row is None else _position_part(row, "row", "the row's number within its binlog event (MySQL connector)")
    return {"binlog": {"file": name, "pos": pos, "row": row}}


def debezium_version(record: dict[str, Any], identity: tuple[str, ...]) -> tuple[dict[str, Any], bytes, str]:
    """A Debezium change event's version: ``(its row image with its op under DEBEZIUM_OP,
    the canonical bytes of the normalized version, its external id)``, or the reject.

    The version is ``{op, <position>, row}``: the op, the source position
    (:func:`debezium_position`) and the row image (``after``; ``before`` for a delete). Its
    canonical bytes make the record key and content hash, so an event re-sent with other
    timestamps (``ts_ms``, ``source.ts_ms``) or with(out) the schema wrapper is the same
    version. The external id is the identity fields' values (JSON text of the list when
    there are several). ``op: t`` (truncate) is a reject: idem does not apply truncates."""
    event = debezium_envelope(record)
    op = event.get("op")
    if op == "t":
        raise line_error("truncate", "op t (truncate): idem does not apply truncates (the table's current rows stay)", "op")
    if op not in DEBEZIUM_OPS:
        shown = json.dumps(op, ensure_ascii=False)[:40]
        raise line_error("debezium", f"not a Debezium change event: op is {shown} (expected c, u, r, d or t)", "op")
    position = debezium_position(event.get("source"))
    image = event.get("before" if op == "d" else "after")
    if not isinstance(image, dict):
        which = "before (a delete's row image: REPLICA IDENTITY must not be NOTHING)" if op == "d" else "after"
        raise line_error("debezium", f"op {op}: {which} is not an object", which.split()[0])
    values = [image.get(name) for name in identity]
    try:
        texts = [ext_id_text(value) for value in values]
    except TypeError as exc:
        raise line_error("identity", f"identity field {exc}") from None
    missing = [name for name, text in zip(identity, texts, strict=True) if not text]
    if missing:
        raise line_error("identity", f"the row image has no value for identity field {missing[0]!r}", missing[0])
    canonical = canonical_value_bytes({**position, "op": op, "row": image})
    ext = texts[0] if len(texts) == 1 and texts[0] else canonical_value_bytes(values).decode("utf-8")
    return {**image, DEBEZIUM_OP: op}, canonical, ext
