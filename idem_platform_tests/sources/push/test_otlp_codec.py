"""The OTLP/HTTP logs codec (``idem_platform.sources.push.otlp``): no database, no server.

Protobuf payloads come from the OpenTelemetry SDK itself (a ``LoggerProvider``
feeding an in-memory exporter, encoded by the OTLP exporter's ``encode_logs``),
JSON payloads are hand-written the way the OTLP spec shows them (hex ids,
camelCase, stringified int64) or derived from the protobuf with ``json_format``.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from idem_platform.contract.catalog import ColumnType
from idem_platform.contract.otlp_logs import DEFAULT_LOG_RECORD_TYPE, LOG_COLUMNS
from idem_platform.sources.push import otlp
from idem_platform.sources.push.otlp import (
    JSON,
    PROTOBUF,
    DecodedLogs,
    MalformedExport,
    UnsupportedMediaType,
    decode_export,
    encode_response,
    to_ndjson,
)

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
T0 = 1544712660300000000
RESOURCE_SCHEMA = "https://opentelemetry.io/schemas/1.26.0"
SCOPE_SCHEMA = "https://example.com/scope-schema"


# --- payloads -----------------------------------------------------------------------


def sdk_request() -> ExportLogsServiceRequest:
    """Two log records emitted through the real SDK, encoded as its OTLP exporter does."""
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider(
        resource=Resource({"service.name": "checkout", "host.cpus": 2}, schema_url=RESOURCE_SCHEMA),
        shutdown_on_exit=False,
    )
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger(
        "idem.tests", "1.2.3", schema_url=SCOPE_SCHEMA, attributes={"lib.kind": "test"}
    )
    span = NonRecordingSpan(
        SpanContext(
            trace_id=int(TRACE_ID, 16),
            span_id=int(SPAN_ID, 16),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    )
    logger.emit(
        timestamp=T0,
        observed_timestamp=T0 + 1,
        context=trace.set_span_in_context(span),
        severity_number=SeverityNumber.ERROR,
        severity_text="ERROR",
        body={"msg": "payment réfusé", "amount": 2**62 + 1, "ratio": 2.5, "retry": True},
        attributes={"http.status_code": 500, "tags": ["a", "b"]},
        event_name="checkout.failed",
    )
    logger.emit(
        timestamp=T0 + 2,
        observed_timestamp=T0 + 3,
        severity_number=SeverityNumber.INFO,
        body="plain text",
    )
    provider.shutdown()
    return encode_logs(exporter.get_finished_logs())


EXPECTED_RESOURCE = {
    "attributes": {"service.name": "checkout", "host.cpus": 2},
    "schema_url": RESOURCE_SCHEMA,
}
EXPECTED_SCOPE = {
    "name": "idem.tests",
    "version": "1.2.3",
    "attributes": {"lib.kind": "test"},
    "schema_url": SCOPE_SCHEMA,
}
EXPECTED_RECORDS = [
    {
        "time": T0,
        "observed_time": T0 + 1,
        "severity_number": 17,
        "severity_text": "ERROR",
        "body": {"msg": "payment réfusé", "amount": 2**62 + 1, "ratio": 2.5, "retry": True},
        "attributes": {"http.status_code": 500, "tags": ["a", "b"]},
        "resource": EXPECTED_RESOURCE,
        "scope": EXPECTED_SCOPE,
        "trace_id": TRACE_ID,
        "span_id": SPAN_ID,
        "event_name": "checkout.failed",
        "flags": 1,
    },
    {
        "time": T0 + 2,
        "observed_time": T0 + 3,
        "severity_number": 9,
        "severity_text": None,
        "body": "plain text",
        "attributes": {},
        "resource": EXPECTED_RESOURCE,
        "scope": EXPECTED_SCOPE,
        "trace_id": None,
        "span_id": None,
    },
]


def string_attr(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


HANDMADE_JSON: dict[str, Any] = {
    # The OTLP spec's JSON example, filled with the same logs as sdk_request().
    "resourceLogs": [
        {
            "resource": {
                "attributes": [
                    string_attr("service.name", "checkout"),
                    {"key": "host.cpus", "value": {"intValue": "2"}},
                ]
            },
            "schemaUrl": RESOURCE_SCHEMA,
            "scopeLogs": [
                {
                    "scope": {
                        "name": "idem.tests",
                        "version": "1.2.3",
                        "attributes": [string_attr("lib.kind", "test")],
                    },
                    "schemaUrl": SCOPE_SCHEMA,
                    "logRecords": [
                        {
                            "timeUnixNano": str(T0),
                            "observedTimeUnixNano": str(T0 + 1),
                            "severityNumber": 17,
                            "severityText": "ERROR",
                            "traceId": TRACE_ID.upper(),  # hex, case-insensitive
                            "spanId": SPAN_ID,
                            "flags": 1,
                            "eventName": "checkout.failed",
                            "body": {
                                "kvlistValue": {
                                    "values": [
                                        string_attr("msg", "payment réfusé"),
                                        {"key": "amount", "value": {"intValue": str(2**62 + 1)}},
                                        {"key": "ratio", "value": {"doubleValue": 2.5}},
                                        {"key": "retry", "value": {"boolValue": True}},
                                    ]
                                }
                            },
                            "attributes": [
                                {"key": "http.status_code", "value": {"intValue": 500}},
                                {
                                    "key": "tags",
                                    "value": {
                                        "arrayValue": {
                                            "values": [{"stringValue": "a"}, {"stringValue": "b"}]
                                        }
                                    },
                                },
                            ],
                            "someFutureField": {"ignored": True},
                        },
                        {
                            "timeUnixNano": T0 + 2,  # 64-bit ints may be numbers too
                            "observedTimeUnixNano": str(T0 + 3),
                            "severityNumber": 9,
                            "traceId": "",
                            "spanId": "",
                            "body": {"stringValue": "plain text"},
                        },
                    ],
                }
            ],
        }
    ]
}


def hex_ids(document: dict[str, Any]) -> dict[str, Any]:
    """json_format writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    document = copy.deepcopy(document)
    for resource_logs in document.get("resourceLogs", document.get("resource_logs", [])):
        for scope_logs in resource_logs.get("scopeLogs", resource_logs.get("scope_logs", [])):
            for log in scope_logs.get("logRecords", scope_logs.get("log_records", [])):
                for name in ("traceId", "spanId", "trace_id", "span_id"):
                    if name in log:
                        log[name] = base64.b64decode(log[name]).hex()
    return document


def json_body(document: Any) -> bytes:
    return json.dumps(document).encode("utf-8")


def one_log(log: LogRecord, *, resource: PbResource | None = None) -> ExportLogsServiceRequest:
    return ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                resource=resource or PbResource(),
                scope_logs=[ScopeLogs(scope=InstrumentationScope(), log_records=[log])],
            )
        ]
    )


def decode_pb(request: ExportLogsServiceRequest) -> DecodedLogs:
    return decode_export(request.SerializeToString(), PROTOBUF)


# --- the SDK's protobuf and the JSON mapping ---------------------------------------


def test_sdk_protobuf_decodes_to_the_documented_record_shape() -> None:
    decoded = decode_pb(sdk_request())
    assert decoded.rejected == 0
    assert decoded.problems == []
    assert decoded.message == ""
    assert decoded.records == EXPECTED_RECORDS
    for record in decoded.records:
        assert LOG_COLUMNS.keys() <= record.keys()


def test_handmade_json_decodes_like_the_sdk_protobuf() -> None:
    from_pb = decode_pb(sdk_request())
    from_json = decode_export(json_body(HANDMADE_JSON), JSON)
    assert from_json.rejected == 0, from_json.problems
    assert from_json.records == from_pb.records
    assert to_ndjson(from_json.records) == to_ndjson(from_pb.records)


@pytest.mark.parametrize(
    "options",
    [
        {},  # camelCase, int64 as strings, enums as names
        {"use_integers_for_enums": True},  # what OTLP/JSON mandates
        {"preserving_proto_field_name": True},  # snake_case, as json_format also accepts
        {"preserving_proto_field_name": True, "use_integers_for_enums": True},
    ],
)
def test_message_to_dict_variants_decode_like_the_protobuf(options: dict[str, bool]) -> None:
    request = sdk_request()
    document = hex_ids(json_format.MessageToDict(request, **options))
    from_json = decode_export(json_body(document), "application/json; charset=utf-8")
    assert from_json.rejected == 0, from_json.problems
    assert to_ndjson(from_json.records) == to_ndjson(decode_pb(request).records)


def test_int64_as_json_numbers_or_strings_alike() -> None:
    as_numbers = copy.deepcopy(HANDMADE_JSON)
    log = as_numbers["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    log["timeUnixNano"] = T0
    log["observedTimeUnixNano"] = T0 + 1
    log["body"]["kvlistValue"]["values"][1]["value"]["intValue"] = 2**62 + 1
    assert (
        decode_export(json_body(as_numbers), JSON).records
        == decode_export(json_body(HANDMADE_JSON), JSON).records
    )


def test_decoding_is_deterministic() -> None:
    body = sdk_request().SerializeToString()
    first = to_ndjson(decode_export(body, PROTOBUF).records)
    second = to_ndjson(decode_export(body, PROTOBUF).records)
    assert first == second
    # A second SDK run of the same logs encodes and decodes to the same bytes too.
    assert to_ndjson(decode_pb(sdk_request()).records) == first
    json_first = to_ndjson(decode_export(json_body(HANDMADE_JSON), JSON).records)
    assert json_first == first


def test_ndjson_form() -> None:
    ndjson = to_ndjson(decode_pb(sdk_request()).records)
    lines = ndjson.split(b"\n")
    assert lines[-1] == b""  # trailing newline
    assert len(lines) == 3
    first = lines[0].decode("utf-8")
    assert "réfusé" in first  # UTF-8, not \u escapes
    assert ", " not in first and ": " not in first  # compact
    parsed = json.loads(first)
    assert list(parsed) == sorted(parsed)
    assert list(parsed["resource"]) == sorted(parsed["resource"])
    assert parsed["body"]["amount"] == 2**62 + 1  # exact
    assert to_ndjson([]) == b""


def test_columns_are_catalog_types() -> None:
    assert DEFAULT_LOG_RECORD_TYPE == "log"
    assert list(LOG_COLUMNS) == [
        "time",
        "observed_time",
        "severity_number",
        "severity_text",
        "body",
        "attributes",
        "resource",
        "scope",
        "trace_id",
        "span_id",
    ]
    for kind in LOG_COLUMNS.values():
        assert str(ColumnType.parse(kind)) == kind


# --- AnyValue -----------------------------------------------------------------------


ANY_VALUES: list[tuple[str, AnyValue, dict[str, Any], Any]] = [
    (
        "string",
        AnyValue(string_value="héllo\nworld"),
        {"stringValue": "héllo\nworld"},
        "héllo\nworld",
    ),
    ("empty string", AnyValue(string_value=""), {"stringValue": ""}, ""),
    ("bool", AnyValue(bool_value=False), {"boolValue": False}, False),
    ("int", AnyValue(int_value=-(2**63)), {"intValue": str(-(2**63))}, -(2**63)),
    ("int zero", AnyValue(int_value=0), {"intValue": "0"}, 0),
    ("double", AnyValue(double_value=0.1), {"doubleValue": 0.1}, 0.1),
    ("double integral", AnyValue(double_value=3.0), {"doubleValue": 3}, 3.0),
    ("nan", AnyValue(double_value=float("nan")), {"doubleValue": "NaN"}, "NaN"),
    ("inf", AnyValue(double_value=float("inf")), {"doubleValue": "Infinity"}, "Infinity"),
    ("-inf", AnyValue(double_value=float("-inf")), {"doubleValue": "-Infinity"}, "-Infinity"),
    (
        "bytes",
        AnyValue(bytes_value=b"\x00\xffidem"),
        {"bytesValue": base64.b64encode(b"\x00\xffidem").decode()},
        base64.b64encode(b"\x00\xffidem").decode(),
    ),
    (
        "array",
        AnyValue(
            array_value=ArrayValue(
                values=[AnyValue(int_value=1), AnyValue(string_value="x"), AnyValue()]
            )
        ),
        {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "x"}, {}]}},
        [1, "x", None],
    ),
    (
        "kvlist",
        AnyValue(
            kvlist_value=KeyValueList(
                values=[
                    KeyValue(key="a", value=AnyValue(bool_value=True)),
                    KeyValue(
                        key="nested",
                        value=AnyValue(
                            kvlist_value=KeyValueList(
                                values=[
                                    KeyValue(key="b", value=AnyValue(double_value=float("nan")))
                                ]
                            )
                        ),
                    ),
                    KeyValue(key="unset"),
                ]
            )
        ),
        {
            "kvlistValue": {
                "values": [
                    {"key": "a", "value": {"boolValue": True}},
                    {
                        "key": "nested",
                        "value": {
                            "kvlistValue": {
                                "values": [{"key": "b", "value": {"doubleValue": "NaN"}}]
                            }
                        },
                    },
                    {"key": "unset"},
                ]
            }
        },
        {"a": True, "nested": {"b": "NaN"}, "unset": None},
    ),
    ("empty", AnyValue(), {}, None),
]


@pytest.mark.parametrize(
    ("pb_value", "json_value", "expected"),
    [case[1:] for case in ANY_VALUES],
    ids=[case[0] for case in ANY_VALUES],
)
def test_any_value_kinds(pb_value: AnyValue, json_value: dict[str, Any], expected: Any) -> None:
    from_pb = decode_pb(
        one_log(LogRecord(body=pb_value, attributes=[KeyValue(key="v", value=pb_value)]))
    )
    document = {
        "resourceLogs": [
            {
                "scopeLogs": [
                    {
                        "logRecords": [
                            {"body": json_value, "attributes": [{"key": "v", "value": json_value}]}
                        ]
                    }
                ]
            }
        ]
    }
    from_json = decode_export(json_body(document), JSON)
    for decoded in (from_pb, from_json):
        assert decoded.rejected == 0, decoded.problems
        (record,) = decoded.records
        assert record["body"] == expected
        assert type(record["body"]) is type(expected)
        assert record["attributes"] == {"v": expected}
    ndjson = to_ndjson(from_pb.records)
    assert ndjson == to_ndjson(from_json.records)
    json.loads(ndjson)  # strictly valid JSON (no NaN literals)


def test_nan_double_never_breaks_ndjson() -> None:
    decoded = decode_pb(one_log(LogRecord(body=AnyValue(double_value=float("nan")))))
    assert decoded.records[0]["body"] == "NaN"
    line = to_ndjson(decoded.records)
    assert b'"body":"NaN"' in line
    assert b"NaN," not in line.replace(b'"NaN"', b"")


def test_unset_body_and_zero_scalars_are_null() -> None:
    (record,) = decode_pb(one_log(LogRecord())).records
    assert record == {
        "time": None,
        "observed_time": None,
        "severity_number": None,
        "severity_text": None,
        "body": None,
        "attributes": {},
        "resource": {"attributes": {}},
        "scope": {"name": None, "version": None, "attributes": {}},
        "trace_id": None,
        "span_id": None,
    }


def test_repeated_attribute_key_keeps_the_last_value() -> None:
    log = LogRecord(
        attributes=[
            KeyValue(key="k", value=AnyValue(string_value="first")),
            KeyValue(key="k", value=AnyValue(string_value="last")),
        ]
    )
    assert decode_pb(one_log(log)).records[0]["attributes"] == {"k": "last"}


def test_dropped_counts_and_all_zero_ids() -> None:
    log = LogRecord(
        trace_id=bytes(16),
        span_id=bytes(8),
        dropped_attributes_count=3,
        attributes=[KeyValue(key="k", value=AnyValue(int_value=1))],
    )
    resource = PbResource(
        attributes=[KeyValue(key="service.name", value=AnyValue(string_value="s"))],
        dropped_attributes_count=2,
    )
    (record,) = decode_pb(one_log(log, resource=resource)).records
    assert record["trace_id"] is None and record["span_id"] is None  # all zero: no trace
    assert record["dropped_attributes_count"] == 3
    assert record["resource"] == {
        "attributes": {"service.name": "s"},
        "dropped_attributes_count": 2,
    }
    assert "flags" not in record and "event_name" not in record


# --- rejections ---------------------------------------------------------------------


def three_logs(middle: LogRecord) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    scope_logs = request.resource_logs.add().scope_logs.add()
    scope_logs.log_records.append(LogRecord(body=AnyValue(string_value="before")))
    scope_logs.log_records.append(middle)
    scope_logs.log_records.append(LogRecord(body=AnyValue(string_value="after")))
    return request


@pytest.mark.parametrize(
    ("middle", "reason"),
    [
        (LogRecord(trace_id=b"\x01\x02\x03"), "trace_id must be 16 bytes, got 3"),
        (
            LogRecord(trace_id=bytes(range(1, 17)), span_id=b"\x01" * 9),
            "span_id must be 8 bytes, got 9",
        ),
        (LogRecord(time_unix_nano=2**63), "time_unix_nano"),
        (LogRecord(observed_time_unix_nano=2**64 - 1), "observed_time_unix_nano"),
        (LogRecord(body=AnyValue(string_value="a\x00b")), "NUL"),
        (LogRecord(attributes=[KeyValue(key="k\x00", value=AnyValue(int_value=1))]), "NUL"),
    ],
    ids=[
        "short trace_id",
        "long span_id",
        "time past 2262",
        "observed_time",
        "NUL body",
        "NUL key",
    ],
)
def test_protobuf_bad_record_is_rejected_and_the_rest_kept(middle: LogRecord, reason: str) -> None:
    decoded = decode_pb(three_logs(middle))
    assert [record["body"] for record in decoded.records] == ["before", "after"]
    assert decoded.rejected == 1
    (problem,) = decoded.problems
    assert problem.startswith("resourceLogs[0].scopeLogs[0].logRecords[1]: ")
    assert reason in problem
    assert decoded.message.startswith("1 of 3 log records rejected: resourceLogs[0]")


def test_strindex_any_value_is_rejected() -> None:
    if "string_value_strindex" not in AnyValue.DESCRIPTOR.fields_by_name:
        pytest.skip("this opentelemetry-proto has no string_value_strindex")
    decoded = decode_pb(three_logs(LogRecord(body=AnyValue(string_value_strindex=3))))
    assert decoded.rejected == 1
    assert "string_value_strindex" in decoded.problems[0]


def json_three_logs(middle: Any) -> bytes:
    return json_body(
        {
            "resourceLogs": [
                {
                    "scopeLogs": [
                        {
                            "logRecords": [
                                {"body": {"stringValue": "before"}},
                                middle,
                                {"body": {"stringValue": "after"}},
                            ]
                        }
                    ]
                }
            ]
        }
    )


@pytest.mark.parametrize(
    ("middle", "reason"),
    [
        (
            {"traceId": "5b8efff798038103d269b633813fc6"},
            "traceId must be 32 hex digits (16 bytes), got 30",
        ),
        ({"traceId": "zz8efff798038103d269b633813fc60c"}, "traceId is not hex"),
        (
            {"traceId": "5b8efff7 98038103d269b633813fc60"},
            "traceId is not hex",
        ),  # fromhex would take it
        # json_format's base64 for bytes is not OTLP/JSON: it is not taken for hex
        ({"traceId": base64.b64encode(bytes.fromhex(TRACE_ID)).decode()}, "traceId"),
        ({"spanId": "eee19b7ec3c1b1"}, "spanId must be 16 hex digits (8 bytes), got 14"),
        ({"span_id": 12}, "spanId must be a hex string"),
        ({"timeUnixNano": "soon"}, "timeUnixNano"),
        ({"timeUnixNano": str(2**64)}, "timeUnixNano"),
        ({"timeUnixNano": str(2**63)}, "time_unix_nano"),
        ({"body": {"intValue": 1.5}}, "intValue"),
        ({"body": {"stringValue": "a\ud800b"}}, "surrogate"),
        ({"body": {"stringValue": "a\u0000b"}}, "NUL"),
        ("not an object", "a log record must be an object, got a string"),
    ],
)
def test_json_bad_record_is_rejected_and_the_rest_kept(middle: Any, reason: str) -> None:
    decoded = decode_export(json_three_logs(middle), JSON)
    assert [record["body"] for record in decoded.records] == ["before", "after"]
    assert decoded.rejected == 1
    (problem,) = decoded.problems
    assert problem.startswith("resourceLogs[0].scopeLogs[0].logRecords[1]: ")
    assert reason in problem


def test_json_bad_resource_rejects_only_its_records() -> None:
    document = {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": "n", "value": {"intValue": "NaN"}}]},
                "scopeLogs": [{"logRecords": [{}, {}]}],
            },
            {"scopeLogs": [{"logRecords": [{"body": {"stringValue": "kept"}}]}]},
        ]
    }
    decoded = decode_export(json_body(document), JSON)
    assert [record["body"] for record in decoded.records] == ["kept"]
    assert decoded.rejected == 2
    assert decoded.problems[0].startswith("resourceLogs[0].scopeLogs[0].logRecords[0]: resource: ")


def test_problems_are_capped_but_all_rejections_counted() -> None:
    request = ExportLogsServiceRequest()
    scope_logs = request.resource_logs.add().scope_logs.add()
    for _ in range(otlp.MAX_PROBLEMS + 3):
        scope_logs.log_records.append(LogRecord(span_id=b"\x01"))
    scope_logs.log_records.append(LogRecord(body=AnyValue(string_value="ok")))
    decoded = decode_pb(request)
    assert decoded.rejected == otlp.MAX_PROBLEMS + 3
    assert len(decoded.problems) == otlp.MAX_PROBLEMS
    assert len(decoded.records) == 1
    assert decoded.message.endswith("(and 3 more)")


# --- whole-request errors -----------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", [None, "", "text/plain", "application/protobuf", "application/jsonl", "*/*"]
)
def test_unsupported_media_type(content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType) as caught:
        decode_export(b"{}", content_type)  # type: ignore[arg-type]
    assert caught.value.status == 415
    assert PROTOBUF in str(caught.value) and JSON in str(caught.value)


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/json; charset=utf-8", JSON),
        ("Application/JSON", JSON),
        (" application/x-protobuf ; foo=bar", PROTOBUF),
        ("application/x-protobuf", PROTOBUF),
    ],
)
def test_content_type_parameters_are_ignored(content_type: str, expected: str) -> None:
    assert otlp.media_type(content_type) == expected
    body = sdk_request().SerializeToString() if expected == PROTOBUF else json_body(HANDMADE_JSON)
    assert len(decode_export(body, content_type).records) == 2


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (b"\xff\xff\xff", PROTOBUF, "protobuf"),
        (b"\x0a\x05abc", PROTOBUF, "protobuf"),  # truncated field
        (b'{"resourceLogs": [', JSON, "char 18"),
        (b"", JSON, "body is not JSON"),
        (b"\xff\xfe\x00garbage", JSON, "body is not JSON"),
        (b"[]", JSON, "must be a JSON object"),
        (b"null", JSON, "must be a JSON object"),
        (b'{"resourceLogs": {}}', JSON, "resourceLogs must be an array"),
        (b'{"resourceLogs": [1]}', JSON, "resourceLogs[0] must be an object"),
        (
            b'{"resourceLogs": [{"scopeLogs": "x"}]}',
            JSON,
            "resourceLogs[0].scopeLogs must be an array",
        ),
        (
            b'{"resourceLogs": [{"scopeLogs": [{"logRecords": {}}]}]}',
            JSON,
            "resourceLogs[0].scopeLogs[0].logRecords must be an array",
        ),
        (b"[" * 100_000 + b"]" * 100_000, JSON, "body"),
    ],
)
def test_malformed_body(body: bytes, content_type: str, fragment: str) -> None:
    with pytest.raises(MalformedExport) as caught:
        decode_export(body, content_type)
    assert caught.value.status == 400
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"", PROTOBUF),
        (ExportLogsServiceRequest().SerializeToString(), PROTOBUF),
        (b"{}", JSON),
        (b'{"resourceLogs": []}', JSON),
        (b'{"resource_logs": [{"scope_logs": [{"log_records": []}]}]}', JSON),
        (b'{"resourceLogs": null}', JSON),
    ],
)
def test_empty_request_gives_zero_records(body: bytes, content_type: str) -> None:
    decoded = decode_export(body, content_type)
    assert decoded == DecodedLogs(records=[], rejected=0, problems=[])
    assert to_ndjson(decoded.records) == b""


# --- responses ----------------------------------------------------------------------


def test_encode_response_full_success() -> None:
    assert encode_response(0, "", PROTOBUF) == b""
    assert ExportLogsServiceResponse.FromString(b"").HasField("partial_success") is False
    assert encode_response(0, "", "application/json; charset=utf-8") == b"{}"


def test_encode_response_partial_success_protobuf() -> None:
    body = encode_response(2, "2 of 5 log records rejected: ...", PROTOBUF)
    response = ExportLogsServiceResponse.FromString(body)
    assert response.HasField("partial_success")
    assert response.partial_success.rejected_log_records == 2
    assert response.partial_success.error_message == "2 of 5 log records rejected: ..."


def test_encode_response_partial_success_json() -> None:
    body = encode_response(3, "bad ids: é", JSON)
    document = json.loads(body)
    # OTLP/JSON: lowerCamelCase; int64 as a decimal string (proto3 JSON), which receivers accept.
    assert document == {"partialSuccess": {"rejectedLogRecords": "3", "errorMessage": "bad ids: é"}}
    response = json_format.Parse(body, ExportLogsServiceResponse())
    assert response.partial_success.rejected_log_records == 3


def test_encode_response_from_a_decode() -> None:
    decoded = decode_pb(three_logs(LogRecord(trace_id=b"\x01")))
    body = encode_response(decoded.rejected, decoded.message, PROTOBUF)
    response = ExportLogsServiceResponse.FromString(body)
    assert response.partial_success.rejected_log_records == 1
    assert "trace_id must be 16 bytes" in response.partial_success.error_message


def test_encode_response_refuses_unknown_media_type() -> None:
    with pytest.raises(UnsupportedMediaType):
        encode_response(0, "", "text/plain")


def test_a_record_longer_than_max_record_bytes_as_ndjson_is_rejected_and_the_rest_keep_their_bytes() -> None:
    request = sdk_request()
    body = request.SerializeToString()
    whole = decode_export(body, PROTOBUF)
    assert whole.ndjson() == to_ndjson(whole.records)
    longest = max(len(line) - 1 for line in whole.ndjson().splitlines(keepends=True))
    shortest = min(len(line) - 1 for line in whole.ndjson().splitlines(keepends=True))
    assert shortest < longest
    cut = decode_export(body, PROTOBUF, max_record_bytes=longest - 1)
    assert 0 < cut.rejected < len(whole.records)
    assert "max_line_bytes" in cut.message and "too_long" in cut.message
    assert cut.ndjson() == to_ndjson(cut.records)
    assert all(len(line) - 1 <= longest - 1 for line in cut.ndjson().splitlines(keepends=True))
    assert decode_export(body, PROTOBUF, max_record_bytes=longest).ndjson() == whole.ndjson()
