"""The table of OpenTelemetry log records: an ``otlp`` connector's record type and columns.

Part of the catalog's rules (the config injects this table for every ``otlp`` connector), so
it lives below both the config and the OTLP decoder that fills it.
"""

DEFAULT_LOG_RECORD_TYPE = "log"
"""The record type OTLP log records land as unless the connector's config names another."""

LOG_COLUMNS: dict[str, str] = {
    "time": "timestamp",
    "observed_time": "timestamp",
    "severity_number": "int",
    "severity_text": "string",
    "body": "dynamic",
    "attributes": "dynamic",
    "resource": "dynamic",
    "scope": "dynamic",
    "trace_id": "string",
    "span_id": "string",
}
"""The ``log`` record type's table spec (column -> catalog type), for the config to inject.

Every record carries these ten keys; the optional extras (``event_name``,
``flags``, ``dropped_attributes_count``) appear only when set.
"""
