"""``POST /v1/logs``: the OpenTelemetry SDK's own OTLP/HTTP log exporter as the client.

An exporter retries a batch it got no answer for; the records are keyed by content
and the batch lands under its content's file key, so the retry writes nothing twice.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource

from idem_platform.config import IdemConfig
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.sources.push.context import ServeSettings
from idem_platform.sources.push.server import BackgroundServer, serve_in_background
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.push import landed_files, push_config


@pytest.fixture(scope="module")
def served(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundServer, IdemConfig]]:
    reset_database(pg_url)
    config = push_config(tmp_path_factory.mktemp("otlp"))
    pipeline.prepare_tables(pg_url, config, config.connector("otel"))
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    yield server, config
    server.stop()


def emitted(count: int, service: str = "checkout") -> Sequence[Any]:
    """``count`` log records made by the SDK (kept in memory, not sent)."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource({"service.name": service}), shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("idem.tests")
    for i in range(count):
        logger.emit(timestamp=1_700_000_000_000_000_000 + i, body={"n": i, "text": "réglé"},
                    severity_text="INFO", attributes={"i": i})
    provider.shutdown()
    return memory.get_finished_logs()


def commit(pg_url: str, config: IdemConfig, spark: Any) -> dict[str, Any]:
    connector = config.connector("otel")
    batch = pipeline.plan_batch(pg_url, connector, landed_files(config, "otel"))
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, config, connector))
    return run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="otlp"), coerced, lambda: spark)


def test_an_exporters_retry_of_the_same_batch_lands_once_and_commits_each_record_once(
    served: tuple[BackgroundServer, IdemConfig], pg_url: str, spark: Any
) -> None:
    server, config = served
    logs = emitted(25)
    exporter = OTLPLogExporter(endpoint=f"{server.url}/v1/logs", compression=Compression.Gzip)
    assert exporter.export(logs) == LogRecordExportResult.SUCCESS
    assert exporter.export(logs) == LogRecordExportResult.SUCCESS  # the retry
    exporter.shutdown()
    files = landed_files(config, "otel")
    assert len(files) == 1 and len(files[0].read_bytes().splitlines()) == 25
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE namespace = 'http:otel'").fetchone() == (1,)
    first = commit(pg_url, config, spark)
    assert first["rows_written"] == 25
    assert commit(pg_url, config, spark)["rows_written"] == 0
    with connect(pg_url) as conn:
        row = conn.execute(
            "SELECT time, severity_text, body, attributes, resource, scope, trace_id FROM idem.log "
            "WHERE body->>'n' = '3'"
        ).fetchone()
    assert row is not None
    assert row[0].timestamp() == pytest.approx(1_700_000_000.0, abs=1e-3)
    assert row[1] == "INFO" and row[2] == {"n": 3, "text": "réglé"} and row[3] == {"i": 3}
    assert row[4]["attributes"]["service.name"] == "checkout" and row[5]["name"] == "idem.tests"
    assert row[6] is None


def test_the_sdks_batch_processor_delivers_through_the_running_server(
    served: tuple[BackgroundServer, IdemConfig], pg_url: str
) -> None:
    server, config = served
    before = len(landed_files(config, "otel"))
    provider = LoggerProvider(resource=Resource({"service.name": "batcher"}), shutdown_on_exit=False)
    provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.url}/v1/logs")))
    logger = provider.get_logger("idem.tests.batch")
    for i in range(10):
        logger.emit(timestamp=1_800_000_000_000_000_000 + i, body=f"line {i}")
    assert provider.force_flush(30_000)
    provider.shutdown()
    after = landed_files(config, "otel")
    assert len(after) == before + 1
    lines = [json.loads(line) for p in after for line in p.read_bytes().splitlines()]
    assert sum(1 for r in lines if r["resource"]["attributes"].get("service.name") == "batcher") == 10


def test_json_encoding_partial_success_and_refusals(served: tuple[BackgroundServer, IdemConfig]) -> None:
    server, config = served
    document = {
        "resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-client"}}]},
            "scopeLogs": [{
                "scope": {"name": "manual"},
                "logRecords": [
                    {"timeUnixNano": "1700000000000000001", "severityNumber": 9, "body": {"stringValue": "ok"},
                     "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174"},
                    {"timeUnixNano": "1700000000000000002", "body": {"stringValue": "bad id"}, "traceId": "abc"},
                ],
            }],
        }]
    }
    with httpx.Client(base_url=server.url) as http:
        answer = http.post("/v1/logs", json=document)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
        partial = answer.json()["partialSuccess"]
        assert partial["rejectedLogRecords"] in ("1", 1) and "trace" in partial["errorMessage"]
        per_connector = http.post("/v1/connectors/otel/logs", json=document)
        assert per_connector.status_code == 200
        assert http.post("/v1/logs", content=b"<xml/>", headers={"Content-Type": "text/xml"}).status_code == 415
        assert http.post("/v1/logs", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
        assert http.post("/v1/connectors/push/logs", json=document).status_code == 404
    landed = [json.loads(line) for p in landed_files(config, "otel") for line in p.read_bytes().splitlines()]
    ok = [r for r in landed if r["body"] == "ok"]
    assert len(ok) == 1 and ok[0]["trace_id"] == "5b8efff798038103d269b633813fc60c"


def json_export(*bodies: str) -> bytes:
    """An OTLP/JSON request with one log record per body."""
    records = [{"timeUnixNano": "1700000000000000001", "body": {"stringValue": text}} for text in bodies]
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}).encode()


def test_a_gzip_export_lands_every_member_and_a_cut_one_is_400_with_nothing_landed(
    served: tuple[BackgroundServer, IdemConfig], pg_url: str
) -> None:
    server, config = served
    gzipped = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    document = json_export("gz-a", "gz-b", "gz-c")
    with connect(pg_url) as conn:
        rows_before = conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE namespace = 'http:otel'").fetchone()
    before = landed_files(config, "otel")
    with httpx.Client(base_url=server.url) as http:
        cut = http.post("/v1/logs", content=gzip.compress(document)[:-10], headers=gzipped)
        assert cut.status_code == 400 and "truncated" in cut.json()["error"]
        garbage = http.post("/v1/logs", content=gzip.compress(document) + b"junk", headers=gzipped)
        assert garbage.status_code == 400 and "trailing" in garbage.json()["error"]
        assert landed_files(config, "otel") == before
        with connect(pg_url) as conn:
            rows = conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE namespace = 'http:otel'").fetchone()
        assert rows == rows_before
        half = len(document) // 2  # one JSON document split across two members
        members = gzip.compress(document[:half]) + gzip.compress(document[half:])
        whole = http.post("/v1/logs", content=members, headers=gzipped)
        assert whole.status_code == 200 and whole.json() == {}
    landed = [json.loads(line) for p in landed_files(config, "otel") for line in p.read_bytes().splitlines()]
    assert {"gz-a", "gz-b", "gz-c"} <= {r["body"] for r in landed if isinstance(r["body"], str)}


def test_a_log_record_over_max_line_bytes_is_rejected_in_partial_success_not_landed(
    served: tuple[BackgroundServer, IdemConfig]
) -> None:
    server, config = served
    limit = config.connector("otel").max_line_bytes
    attributes = [{"key": f"a{i}", "value": {"intValue": str(i)}} for i in range(limit // 8)]  # ~14 bytes each as JSON
    document = json.loads(json_export("fits", "too-long"))
    document["resourceLogs"][0]["scopeLogs"][0]["logRecords"][1]["attributes"] = attributes
    before = landed_files(config, "otel")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = http.post("/v1/logs", json=document)
    assert answer.status_code == 200
    partial = answer.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] in ("1", 1)
    assert "logRecords[1]" in partial["errorMessage"] and "max_line_bytes" in partial["errorMessage"]
    new = [p for p in landed_files(config, "otel") if p not in before]
    assert [json.loads(line)["body"] for p in new for line in p.read_bytes().splitlines()] == ["fits"]
