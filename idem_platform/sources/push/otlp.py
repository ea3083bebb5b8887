"""OTLP/HTTP logs: an ``ExportLogsServiceRequest`` in, flat ``log`` records (NDJSON) out.

``POST /v1/logs`` accepts both OTLP/HTTP encodings: ``application/x-protobuf``
(what the OpenTelemetry SDKs' exporters send) and ``application/json`` (the
OTLP JSON mapping: lowerCamelCase keys, hex ``traceId``/``spanId``, enums as
integers, 64-bit integers as strings or numbers). This module is the pure
codec between those bodies and the records the file-drop path ingests; the
server decides what to do with them.

Records have no id field: they are keyed by content, so an exporter retrying a
batch must produce the *same bytes* again or it would write twice. Everything
here is therefore deterministic: the same request gives byte-identical
:func:`to_ndjson` output, whichever of the two encodings carried it.

Record shape (one per ``LogRecord``; the ten :data:`~idem_platform.contract.otlp_logs.LOG_COLUMNS` are always present):

* ``time``, ``observed_time``: epoch nanoseconds (integer, exact), ``null`` when 0
  (OTLP's "unknown"). A value past the ``timestamp`` column's range (year 2262)
  rejects the record here, where the exporter still hears about it.
* ``severity_number``: the integer, ``null`` when 0 (``SEVERITY_NUMBER_UNSPECIFIED``);
  ``severity_text``: ``null`` when empty. One rule for every scalar: the proto3
  zero value means "not set" in OTLP, so it becomes ``null``.
* ``body``: the ``AnyValue`` as JSON (see :func:`_value`), ``null`` when unset.
* ``attributes``: object key -> value, ``{}`` when none. A repeated key (OTLP
  forbids them, "behaviour unpredictable") keeps its *last* value, as every JSON
  object parser here does (``json``, orjson, protobuf's map fields).
* ``resource``: ``{"attributes": {...}}`` plus ``schema_url`` (of the
  ``ResourceLogs``) when set and ``dropped_attributes_count`` when nonzero.
* ``scope``: ``{"name", "version", "attributes"}`` (``null`` name/version when
  empty) plus ``schema_url`` (of the ``ScopeLogs``) and
  ``dropped_attributes_count`` when set.
* ``trace_id``, ``span_id``: lower-case hex, ``null`` when empty or all zeroes
  (the OTLP spec: such an id means "not associated with a trace/span").
* only when set: ``event_name``, ``flags`` (the W3C trace flags bit field),
  ``dropped_attributes_count``.

The ``resource`` and ``scope`` objects are shared by the records of one
``ResourceLogs``/``ScopeLogs``: treat records as read-only.

Rejected at decode (counted, the rest go through; the OTLP response reports them
as ``partial_success``): a ``trace_id`` that is not 16 bytes or a ``span_id``
that is not 8 (in JSON: not that many hex digits), a field the JSON mapping
cannot parse, an ``AnyValue`` kind logs cannot carry (``string_value_strindex``
points into a profiles string table), a timestamp out of range, a NUL character
in any string (PostgreSQL cannot store it; the ingest path would reject the
line after the exporter had been told it succeeded), a record whose NDJSON line
is longer than the connector's ``max_line_bytes`` (ingest would make it a
``too_long`` reject, its raw text cut to a head that ``idem rejects retry``
can never replay). A body that does
not parse at all, or whose containers have the wrong shape, is
:class:`MalformedExport` (HTTP 400); an unknown content type is
:class:`UnsupportedMediaType` (HTTP 415).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from idem_platform.coercion.timestamps import NS_MAX
from idem_platform.contract.canonical import has_nul

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ACCEPTED_MEDIA_TYPES = (PROTOBUF, JSON)

MAX_PROBLEMS = 5
"""How many rejection reasons :class:`DecodedLogs` keeps: enough to diagnose, bounded per request."""

_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_M = TypeVar("_M", bound=Message)
_HEX = re.compile(r"[0-9a-fA-F]*", re.ASCII)  # bytes.fromhex alone would accept spaces


class OtlpError(Exception):
    """A request body this codec cannot take; ``status`` is the HTTP answer it deserves."""

    status: int = 400


class UnsupportedMediaType(OtlpError):
    """The ``Content-Type`` is neither OTLP/HTTP encoding (HTTP 415)."""

    status = 415

    def __init__(self, content_type: str | None) -> None:
        self.content_type = content_type
        got = f"{content_type!r}" if content_type else "no Content-Type"
        super().__init__(
            f"unsupported media type {got}: OTLP/HTTP logs accept "
            f"{' or '.join(ACCEPTED_MEDIA_TYPES)}"
        )


class MalformedExport(OtlpError):
    """The body does not parse as an ``ExportLogsServiceRequest`` at all (HTTP 400).

    Retrying cannot help, which is what OTLP's 400 tells the exporter.
    """

    status = 400


class _Rejected(Exception):
    """One log record cannot become a record; the message says why."""


@dataclass(frozen=True)
class DecodedLogs:
    """What a request decoded to: the records to land and what was left out.

    Attributes:
        records: one flat dict per accepted log record, in request order.
        lines: each record's NDJSON line, newline included (what :func:`to_ndjson` writes).
        rejected: how many log records were rejected (OTLP's ``rejected_log_records``).
        problems: the first :data:`MAX_PROBLEMS` reasons, each prefixed with the
            record's path (``resourceLogs[0].scopeLogs[1].logRecords[2]: ...``).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    rejected: int = 0
    problems: list[str] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list, repr=False)

    def ndjson(self) -> bytes:
        """The records as :func:`to_ndjson` writes them, from the lines already encoded."""
        if len(self.lines) == len(self.records):
            return b"".join(self.lines)
        return to_ndjson(self.records)

    @property
    def message(self) -> str:
        """The ``error_message`` of the OTLP partial success: ``""`` when nothing was rejected."""
        if not self.rejected:
            return ""
        total = len(self.records) + self.rejected
        shown = "; ".join(self.problems)
        more = self.rejected - len(self.problems)
        tail = f" (and {more} more)" if more > 0 else ""
        return f"{self.rejected} of {total} log records rejected: {shown}{tail}"


class _Collector:
    """Accumulates records, their NDJSON lines and rejections while walking a request."""

    def __init__(self, max_record_bytes: int | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self.rejected = 0
        self.problems: list[str] = []
        self.max_record_bytes = max_record_bytes

    def take(self, where: str, build: Callable[..., dict[str, Any]], *args: Any) -> None:
        """Append ``build(*args)``'s record, or count the record rejected with its reason."""
        try:
            record = build(*args)
            line = _dumps(record).encode("utf-8")
            if self.max_record_bytes is not None and len(line) > self.max_record_bytes:
                raise _Rejected(
                    f"the record is {len(line)} bytes as an NDJSON line, over this connector's "
                    f"max_line_bytes ({self.max_record_bytes}); ingest would reject it as too_long"
                )
        except _Rejected as exc:
            self.reject(where, str(exc))
            return
        self.records.append(record)
        self.lines.append(line + b"\n")

    def reject(self, where: str, reason: str) -> None:
        self.rejected += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{where}: {reason}")

    def result(self) -> DecodedLogs:
        return DecodedLogs(records=self.records, rejected=self.rejected, problems=self.problems, lines=self.lines)


def media_type(content_type: str | None) -> str:
    """:data:`PROTOBUF` or :data:`JSON` for a ``Content-Type`` header; parameters are ignored.

    ``application/json; charset=utf-8`` is JSON. Anything else raises
    :class:`UnsupportedMediaType`, whose message lists the two accepted types.
    """
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in ACCEPTED_MEDIA_TYPES:
        return kind
    raise UnsupportedMediaType(content_type)


def decode_export(body: bytes, content_type: str | None, *, max_record_bytes: int | None = None) -> DecodedLogs:
    """Decode an OTLP/HTTP logs body into flat ``log`` records.

    With ``max_record_bytes`` (the connector's ``max_line_bytes``), a record whose
    NDJSON line is longer is rejected here, where the exporter hears about it.

    Raises:
        UnsupportedMediaType: ``content_type`` is neither encoding (checked first).
        MalformedExport: the body does not parse (protobuf ``DecodeError``, JSON
            syntax error with its position, containers of the wrong shape).
    """
    kind = media_type(content_type)
    if kind == PROTOBUF:
        return _decode_protobuf(body, _Collector(max_record_bytes))
    return _decode_json(body, _Collector(max_record_bytes))


def encode_response(rejected: int, message: str, content_type: str | None) -> bytes:
    """The ``ExportLogsServiceResponse`` body, in the request's encoding.

    ``partial_success`` is set only when something was rejected (or there is a
    warning ``message`` to pass on), so the usual answer is empty: no bytes in
    protobuf, ``{}`` in JSON. JSON uses the OTLP mapping (lowerCamelCase,
    ``rejectedLogRecords`` as a decimal string, the proto3 rule for int64).
    """
    if rejected < 0:
        raise ValueError(f"rejected must be >= 0, got {rejected}")
    kind = media_type(content_type)
    response = ExportLogsServiceResponse()
    if rejected or message:
        response.partial_success.rejected_log_records = rejected
        response.partial_success.error_message = message
    if kind == PROTOBUF:
        return response.SerializeToString(deterministic=True)
    return _dumps(json_format.MessageToDict(response)).encode("utf-8")


def to_ndjson(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Records as NDJSON: one line each, sorted keys, compact, UTF-8, trailing newline.

    Deterministic by construction (the records' content keys depend on it), and
    it cannot fail on decoded records: non-finite doubles were already turned
    into strings, which is why ``allow_nan=False`` is safe to insist on.
    """
    return b"".join(_dumps(record).encode("utf-8") + b"\n" for record in records)


def _dumps(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


# --- protobuf -----------------------------------------------------------------------


def _decode_protobuf(body: bytes, out: _Collector) -> DecodedLogs:
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except DecodeError as exc:
        raise MalformedExport(f"body is not a protobuf ExportLogsServiceRequest: {exc}") from None
    for i, resource_logs in enumerate(request.resource_logs):
        resource = _context(_resource, resource_logs)
        for j, scope_logs in enumerate(resource_logs.scope_logs):
            scope = _context(_scope, scope_logs)
            for k, log in enumerate(scope_logs.log_records):
                where = f"resourceLogs[{i}].scopeLogs[{j}].logRecords[{k}]"
                out.take(where, _record, resource, scope, log)
    return out.result()


# --- JSON ---------------------------------------------------------------------------


def _decode_json(body: bytes, out: _Collector) -> DecodedLogs:
    """The JSON mapping, walked level by level so one bad record rejects only itself.

    Each level is handed to ``json_format.ParseDict`` without its child list
    (which handles camelCase and snake_case names, int64 strings, enum names or
    numbers, base64 ``bytesValue``, ``"NaN"`` doubles, unknown fields); log
    records first get their hex ids turned into the base64 that ``json_format``
    expects for ``bytes``.
    """
    try:
        document = json.loads(body)
    except UnicodeDecodeError as exc:
        raise MalformedExport(f"body is not JSON: not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise MalformedExport(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedExport("body is not JSON this server accepts: nested too deeply") from None
    if not isinstance(document, dict):
        raise MalformedExport(
            f"body must be a JSON object (ExportLogsServiceRequest), got {_json_kind(document)}"
        )
    for i, raw_resource in enumerate(_children(document, "resourceLogs", "")):
        where_resource = f"resourceLogs[{i}]"
        resource_obj = _object(raw_resource, where_resource)
        resource = _context(_json_resource, resource_obj)
        for j, raw_scope in enumerate(_children(resource_obj, "scopeLogs", where_resource)):
            where_scope = f"{where_resource}.scopeLogs[{j}]"
            scope_obj = _object(raw_scope, where_scope)
            scope = _context(_json_scope, scope_obj)
            for k, raw_log in enumerate(_children(scope_obj, "logRecords", where_scope)):
                out.take(f"{where_scope}.logRecords[{k}]", _json_record, resource, scope, raw_log)
    return out.result()


def _json_resource(obj: dict[str, Any]) -> dict[str, Any]:
    return _resource(_parse_level(obj, ResourceLogs, "scopeLogs"))


def _json_scope(obj: dict[str, Any]) -> dict[str, Any]:
    return _scope(_parse_level(obj, ScopeLogs, "logRecords"))


def _json_record(
    resource: dict[str, Any] | _Rejected, scope: dict[str, Any] | _Rejected, raw: Any
) -> dict[str, Any]:
    return _record(resource, scope, _parse_log_record(raw))


def _snake(camel: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), camel)


def _children(parent: dict[str, Any], camel: str, where: str) -> list[Any]:
    """A container's child list under its camelCase or snake_case name; wrong shape is malformed."""
    snake = _snake(camel)
    value = parent[camel] if camel in parent else parent.get(snake)
    if value is None:
        return []
    if not isinstance(value, list):
        path = f"{where}.{camel}" if where else camel
        raise MalformedExport(f"{path} must be an array, got {_json_kind(value)}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedExport(f"{where} must be an object, got {_json_kind(value)}")
    return value


def _parse_level(obj: dict[str, Any], message_class: type[_M], child: str) -> _M:
    """One container level (a ``ResourceLogs`` or ``ScopeLogs``) without its child list."""
    skip = {child, _snake(child)}
    message = message_class()
    _parse_dict({key: value for key, value in obj.items() if key not in skip}, message)
    return message


def _parse_log_record(raw: Any) -> LogRecord:
    if not isinstance(raw, dict):
        raise _Rejected(f"a log record must be an object, got {_json_kind(raw)}")
    fixed = dict(raw)
    for camel, size in (("traceId", _TRACE_ID_BYTES), ("spanId", _SPAN_ID_BYTES)):
        for name in (camel, _snake(camel)):
            if fixed.get(name) is not None:
                fixed[name] = _hex_to_base64(fixed[name], camel, size)
    log = LogRecord()
    _parse_dict(fixed, log)
    return log


def _hex_to_base64(value: Any, name: str, size: int) -> str:
    """An OTLP/JSON id (hex, unlike proto3 JSON's base64 bytes) as the base64 json_format parses."""
    if not isinstance(value, str):
        raise _Rejected(f"{name} must be a hex string, got {_json_kind(value)}")
    if not _HEX.fullmatch(value):
        raise _Rejected(f"{name} is not hex: {value[:64]!r}")
    if value and len(value) != 2 * size:
        raise _Rejected(f"{name} must be {2 * size} hex digits ({size} bytes), got {len(value)}")
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def _parse_dict(obj: dict[str, Any], message: Message) -> None:
    try:
        json_format.ParseDict(obj, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise _Rejected(str(exc)) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:  # defensive: odd shapes
        raise _Rejected(f"cannot parse: {type(exc).__name__}: {exc}") from None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# --- records ------------------------------------------------------------------------


def _context(build: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any] | _Rejected:
    """A resource or scope object, or the reason it failed (which rejects each record under it)."""
    try:
        return _without_nul(build(*args))
    except _Rejected as exc:
        return exc


def _without_nul(value: Any) -> Any:
    """``value`` itself, unless a key or string in it holds NUL, which PostgreSQL cannot store.

    The ingest path would reject such a record later; rejecting it here tells the
    exporter (``partial_success``) instead of answering success for a reject.
    """
    if has_nul(value):
        raise _Rejected("a string holds a NUL character (\\u0000), which PostgreSQL cannot store")
    return value




def _record(
    resource: dict[str, Any] | _Rejected, scope: dict[str, Any] | _Rejected, log: LogRecord
) -> dict[str, Any]:
    if isinstance(resource, _Rejected):
        raise _Rejected(f"resource: {resource}")
    if isinstance(scope, _Rejected):
        raise _Rejected(f"scope: {scope}")
    record: dict[str, Any] = {
        "time": _time(log.time_unix_nano, "time_unix_nano"),
        "observed_time": _time(log.observed_time_unix_nano, "observed_time_unix_nano"),
        "severity_number": int(log.severity_number) or None,
        "severity_text": log.severity_text or None,
        "body": _value(log.body) if log.HasField("body") else None,
        "attributes": _attributes(log.attributes),
        "resource": resource,
        "scope": scope,
        "trace_id": _id(log.trace_id, _TRACE_ID_BYTES, "trace_id"),
        "span_id": _id(log.span_id, _SPAN_ID_BYTES, "span_id"),
    }
    event_name = getattr(log, "event_name", "")  # new in opentelemetry-proto 1.28
    if event_name:
        record["event_name"] = event_name
    if log.flags:
        record["flags"] = log.flags
    if log.dropped_attributes_count:
        record["dropped_attributes_count"] = log.dropped_attributes_count
    for name, value in record.items():
        if name != "resource" and name != "scope":  # checked once per ResourceLogs/ScopeLogs
            _without_nul(value)
    return record


def _resource(resource_logs: ResourceLogs) -> dict[str, Any]:
    resource = resource_logs.resource
    out: dict[str, Any] = {"attributes": _attributes(resource.attributes)}
    if resource_logs.schema_url:
        out["schema_url"] = resource_logs.schema_url
    if resource.dropped_attributes_count:
        out["dropped_attributes_count"] = resource.dropped_attributes_count
    return out


def _scope(scope_logs: ScopeLogs) -> dict[str, Any]:
    scope = scope_logs.scope
    out: dict[str, Any] = {
        "name": scope.name or None,
        "version": scope.version or None,
        "attributes": _attributes(scope.attributes),
    }
    if scope_logs.schema_url:
        out["schema_url"] = scope_logs.schema_url
    if scope.dropped_attributes_count:
        out["dropped_attributes_count"] = scope.dropped_attributes_count
    return out


def _time(nanos: int, name: str) -> int | None:
    """Epoch nanoseconds, ``None`` for 0 (unknown); past ``timestamp[ns]`` it is a reject."""
    if not nanos:
        return None
    if nanos > NS_MAX:
        raise _Rejected(f"{name} {nanos} is beyond the last representable timestamp (2262)")
    return nanos


def _id(raw: bytes, size: int, name: str) -> str | None:
    """Lower-case hex; ``None`` for an empty or all-zero id (OTLP: not associated)."""
    if not raw:
        return None
    if len(raw) != size:
        raise _Rejected(f"{name} must be {size} bytes, got {len(raw)}")
    if not any(raw):
        return None
    return raw.hex()


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """Key -> value; a repeated key keeps its last value, as JSON objects do."""
    return {pair.key: _value(pair.value) if pair.HasField("value") else None for pair in pairs}


def _value(value: AnyValue) -> Any:
    """An ``AnyValue`` as JSON.

    string, bool and int stay themselves (int exact, beyond 2**53 too), a double
    is a float except NaN and the infinities, which JSON cannot write and become
    the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (the proto3 JSON
    spelling); bytes are base64 (as in OTLP/JSON, so both encodings agree);
    arrays and key-value lists nest; an unset value is ``null``.
    """
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return _double(value.double_value)
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    raise _Rejected(f"AnyValue {kind} is not supported in logs")


def _double(number: float) -> float | str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number
