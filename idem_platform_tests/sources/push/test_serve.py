"""``idem serve``: every HTTP answer of the push API, over a real socket, on real PostgreSQL.

The server runs in a thread of the test process (uvicorn on a free loopback port)
and is called with httpx, as a client would; one test starts ``idem serve`` itself.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from idem_platform.config import IdemConfig
from idem_platform.ledger import Ledger
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.sources.push.context import ServeSettings
from idem_platform.sources.push.server import (
    BackgroundServer,
    bind_host,
    free_port,
    serve_in_background,
)
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.push import landed_files, push_config, wait_until_serving
from idem_platform_tests.helpers.push_load import run_load

NDJSON = {"Content-Type": "application/x-ndjson"}


@pytest.fixture(scope="module")
def served(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundServer, IdemConfig]]:
    reset_database(pg_url)
    config = push_config(tmp_path_factory.mktemp("serve"), max_body_bytes=4096)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    yield server, config
    server.stop()


@pytest.fixture
def client(served: tuple[BackgroundServer, IdemConfig]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0].url, timeout=30) as http:
        yield http


def body(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def ledger_row(url: str, namespace: str, key: str) -> tuple[Any, ...] | None:
    with connect(url) as conn:
        return conn.execute(
            "SELECT status, request_hash, result FROM idem.ingest_ledger WHERE namespace = %s AND key = %s",
            [namespace, key],
        ).fetchone()


def test_a_fresh_key_lands_the_body_durably_and_its_replay_gets_the_recorded_answer(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig], pg_url: str
) -> None:
    config = served[1]
    payload = body({"type": "indicator", "id": "h-1", "name": "a.example"}, {"type": "indicator", "id": "h-2", "name": "b"})
    first = client.post("/v1/connectors/push/records", content=payload, headers={**NDJSON, "Idempotency-Key": "order-1"})
    assert first.status_code == 202, first.text
    answer = first.json()
    assert answer["replayed"] is False and answer["lines"] == 2 and answer["bytes"] == len(payload)
    assert answer["idempotency_key"] == "order-1"
    landed = config.connector("push").path / Path(answer["path"]).name  # type: ignore[operator]
    assert landed.read_bytes() == payload
    assert answer["file_key"] == "filedrop:" + landed.stem
    assert not [p for p in landed.parent.iterdir() if p.name.startswith(".")]  # no spool left behind
    again = client.post("/v1/connectors/push/records", content=payload, headers={**NDJSON, "X-Idempotency-Key": "order-1"})
    assert again.status_code == 202
    assert again.json() == {**answer, "replayed": True}
    assert [p.name for p in landed_files(config)].count(landed.name) == 1
    row = ledger_row(pg_url, "http:push", "order-1")
    assert row is not None and row[0] == "committed" and row[2]["file_key"] == answer["file_key"]


def test_the_same_key_with_another_body_is_422_and_leaves_the_first_untouched(
    client: httpx.Client, pg_url: str
) -> None:
    first = client.post("/v1/connectors/push/records", content=body({"id": "m-1"}), headers={**NDJSON, "Idempotency-Key": "m"})
    assert first.status_code == 202
    before = ledger_row(pg_url, "http:push", "m")
    other = client.post("/v1/connectors/push/records", content=body({"id": "m-2"}), headers={**NDJSON, "Idempotency-Key": "m"})
    assert other.status_code == 422
    problem = other.json()
    assert problem["recorded_request_hash"] == before[1]  # type: ignore[index]
    assert problem["submitted_request_hash"] != problem["recorded_request_hash"]
    assert ledger_row(pg_url, "http:push", "m") == before


def test_without_a_key_the_file_key_is_the_key(client: httpx.Client, pg_url: str) -> None:
    payload = body({"type": "malware", "id": "nokey-1", "name": "x"})
    first = client.post("/v1/connectors/push/records", content=payload, headers=NDJSON)
    assert first.status_code == 202
    assert first.json()["idempotency_key"] == first.json()["file_key"]
    second = client.post("/v1/connectors/push/records", content=payload, headers=NDJSON)
    assert second.json()["replayed"] is True
    assert ledger_row(pg_url, "http:push", first.json()["file_key"]) is not None


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "blank"), ("k" * 256, "256 characters"), ("a\tb", "control character 0x09")],
)
def test_an_invalid_key_is_400_naming_the_problem(client: httpx.Client, key: str, message: str) -> None:
    answer = client.post("/v1/connectors/push/records", content=body({"id": 1}), headers={**NDJSON, "Idempotency-Key": key})
    assert answer.status_code == 400
    assert message in answer.json()["error"]


def test_refusals_unknown_connector_media_type_size_and_empty_body(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig]
) -> None:
    before = landed_files(served[1])
    unknown = client.post("/v1/connectors/nope/records", content=body({"id": 1}), headers=NDJSON)
    assert unknown.status_code == 404 and unknown.json()["connectors"] == ["push"]
    csv = client.post("/v1/connectors/push/records", content=b"a,b\n", headers={"Content-Type": "text/csv"})
    assert csv.status_code == 415 and "application/x-ndjson" in csv.json()["error"]
    big = client.post("/v1/connectors/push/records", content=b"{}\n" * 2000, headers=NDJSON)
    assert big.status_code == 413 and big.json()["max_body_bytes"] == 4096

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        for _ in range(100):
            yield b'{"id": "x"}\n' * 10

    streamed = client.post("/v1/connectors/push/records", content=chunks(), headers=NDJSON)
    assert streamed.status_code == 413
    empty = client.post("/v1/connectors/push/records", content=b"", headers=NDJSON)
    assert empty.status_code == 400
    assert landed_files(served[1]) == before  # nothing landed, no spool left


def test_a_gzip_body_is_landed_decompressed(client: httpx.Client, served: tuple[BackgroundServer, IdemConfig]) -> None:
    payload = body({"type": "indicator", "id": "gz-1", "name": "gz"})
    answer = client.post(
        "/v1/connectors/push/records",
        content=gzip.compress(payload),
        headers={**NDJSON, "Content-Encoding": "gzip", "Idempotency-Key": "gz"},
    )
    assert answer.status_code == 202
    landed = served[1].connector("push").path / Path(answer.json()["path"]).name  # type: ignore[operator]
    assert landed.read_bytes() == payload


def test_the_same_key_while_the_first_is_in_flight_is_409_with_retry_after(client: httpx.Client, pg_url: str) -> None:
    with connect(pg_url) as holder:
        with holder.transaction(force_rollback=True):
            Ledger(holder, "http:push").begin("busy", {"someone": "else"})
            started = time.monotonic()
            answer = client.post("/v1/connectors/push/records", content=body({"id": "b"}), headers={**NDJSON, "Idempotency-Key": "busy"})
            assert answer.status_code == 409
            assert answer.headers["Retry-After"] == "1"
            assert time.monotonic() - started < 5
    after = client.post("/v1/connectors/push/records", content=body({"id": "b"}), headers={**NDJSON, "Idempotency-Key": "busy"})
    assert after.status_code == 202


def test_healthz_openapi_and_the_status_of_a_body_before_and_after_its_commit(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig], pg_url: str, spark: Any
) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "postgres": "reachable"}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/connectors/{name}/records", "/v1/logs", "/v1/commits/{file_key}", "/healthz"} <= set(paths)
    payload = body(
        {"type": "indicator", "id": "s-1", "name": "committed.example", "confidence": 7},
        {"type": "indicator", "id": "s-2", "confidence": 1},  # no name: a reject
    )
    landed = client.post("/v1/connectors/push/records", content=payload, headers=NDJSON).json()
    status = client.get(landed["status_url"])
    assert status.status_code == 200 and status.json()["status"] == "landed"
    config = served[1]
    connector = config.connector("push")
    path = connector.path / Path(landed["path"]).name  # type: ignore[operator]
    batch = pipeline.plan_batch(pg_url, connector, [path])
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, config, connector))
    run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="serve-test"), coerced, lambda: spark)
    done = client.get(landed["status_url"]).json()
    assert done["status"] == "committed"
    assert done["rows_rejected"] == 1 and done["rejects"][0]["line"] == 2
    assert "name" in json.dumps(done["rejects"][0]["reasons"])
    assert done["commit"]["rows_written"] == 1
    unknown = client.get("/v1/commits/filedrop:" + "0" * 64)
    assert unknown.status_code == 404
    assert client.get("/v1/commits/not-a-key").status_code == 400


def test_a_token_is_required_when_set_and_without_one_only_loopback_is_bound(pg_url: str, tmp_path: Path) -> None:
    assert bind_host("0.0.0.0", None)[0] == "127.0.0.1"
    assert "IDEM_HTTP_TOKEN" in (bind_host("0.0.0.0", None)[1] or "")
    assert bind_host("0.0.0.0", "t") == ("0.0.0.0", None)
    assert bind_host("::1", None) == ("::1", None)
    config = push_config(tmp_path)
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url, token="s3cret"))
    try:
        with httpx.Client(base_url=server.url) as http:
            payload = body({"id": "t-1"})
            assert http.post("/v1/connectors/push/records", content=payload, headers=NDJSON).status_code == 401
            wrong = http.post("/v1/connectors/push/records", content=payload, headers={**NDJSON, "Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
            right = http.post("/v1/connectors/push/records", content=payload, headers={**NDJSON, "Authorization": "Bearer s3cret"})
            assert right.status_code == 202
            assert http.get("/healthz").status_code == 200
    finally:
        server.stop()


def test_2000_requests_over_200_keys_from_32_clients_land_200_files_and_commit_every_row_once(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = push_config(tmp_path)
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    try:
        load = run_load(server.url, "push", requests=2000, keys=200, clients=32, records_per_body=5)
    finally:
        server.stop()
    assert load.statuses == {202: 2000}, load.summary()  # no 5xx, nothing lost
    assert load.replayed == 1800
    assert all(len(keys) == 1 for keys in load.file_keys.values()) and len(load.file_keys) == 200
    files = landed_files(config)
    assert len(files) == 200 and all(not p.name.startswith(".") for p in files)
    with connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT result->>'file_key') FROM idem.ingest_ledger "
            "WHERE namespace = 'http:push' AND key LIKE 'load-key-%%' AND status = 'committed'"
        ).fetchone()
    assert rows == (200, 200)
    connector = config.connector("push")
    pipeline.prepare_tables(pg_url, config, connector)
    for replay in (False, True):
        batch = pipeline.plan_batch(pg_url, connector, files)
        coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, config, connector))
        result = run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id=f"load-{replay}"), coerced, lambda: spark)
        assert result["rows_written"] == (0 if replay else 1000)
    with connect(pg_url) as conn:
        count, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT _external_id) FROM idem.indicator WHERE _external_id LIKE 'load-%%'"
        ).fetchone()
    assert count == distinct == 1000


@pytest.mark.slow
def test_idem_serve_from_the_command_line(pg_url: str, tmp_path: Path) -> None:
    config = push_config(tmp_path)
    port = free_port()
    env = {**cli_env(pg_url, tmp_path, config), "IDEM_HTTP_TOKEN": ""}
    process = subprocess.Popen(
        idem_command("serve", "--port", str(port), "--host", "0.0.0.0"),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until_serving(process, port, poll=0.2)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/connectors/push/records", content=body({"id": "cli"}), headers=NDJSON
        )
        assert answer.status_code == 202
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert "listens on 127.0.0.1 only" in err
    assert "http   push -> drop/push" in err or "push -> drop/push" in err
    # uvicorn finishes requests in flight, then re-raises the signal it caught
    assert process.returncode in (0, -signal.SIGTERM) and "Traceback" not in err


def test_the_connectors_sensor_picks_up_what_idem_serve_lands_and_its_run_commits_it(
    pg_url: str, tmp_path: Path
) -> None:
    import dagster as dg

    from idem_platform_tests.helpers.sensors import SensorTicker

    reset_database(pg_url)
    config = push_config(tmp_path)
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    try:
        with httpx.Client(base_url=server.url) as http:
            payload = body({"type": "malware", "id": "dg-1", "name": "via-http"}, {"type": "indicator", "id": "dg-2", "name": "b"})
            landed = http.post("/v1/connectors/push/records", content=payload, headers={**NDJSON, "Idempotency-Key": "dg"}).json()
            directory = config.connector("push").path
            assert directory is not None
            copying = directory / ("0" * 64 + ".ndjson")  # a landed name, but not what its bytes hash to
            copying.write_bytes(b'{"type": "malware", "id": "dg-3", "na')
            with dg.instance_for_test() as instance:
                ticker = SensorTicker(config, instance, pg_url, "push_push_sensor")
                assert ticker.sensor.minimum_interval_seconds == 5
                # landed whole (fsync, rename): its run is asked on the first look
                (request,) = ticker.tick().run_requests
                assert request.tags["idem/file_key"] == landed["file_key"] and request.tags["idem/files"] == "1"
                copying.unlink()
                result = ticker.run(request, "push_ingest")
                assert result.success
                assert ticker.tick().run_requests == []  # committed: nothing more
            status = http.get(landed["status_url"]).json()
    finally:
        server.stop()
    assert status["status"] == "committed" and status["commit"]["rows_written"] == 2
    with connect(pg_url) as conn:
        assert conn.execute("SELECT name FROM idem.malware WHERE _external_id = 'dg-1'").fetchone() == ("via-http",)


def test_a_spool_keeps_small_bodies_in_memory_and_spills_large_ones_to_a_dotfile(tmp_path: Path) -> None:
    from idem_platform.sources.push.landing import Spool

    small = Spool(tmp_path / "land", limit=1 << 20, in_memory=64)
    small.write(b'{"a":1}\n')
    assert not (tmp_path / "land").exists()  # a replay would cost no file at all
    small.discard()
    big = Spool(tmp_path / "land", limit=1 << 20, in_memory=64)
    for _ in range(10):
        big.write(b'{"a":1}\n' * 5)
    assert [p.name.startswith(".push-") for p in (tmp_path / "land").iterdir()] == [True]
    landed = big.publish()
    assert landed.path.read_bytes() == b'{"a":1}\n' * 50 and landed.lines == 50 and landed.bytes == 400
    assert [p.name for p in (tmp_path / "land").iterdir()] == [landed.path.name]
    again = Spool(tmp_path / "land", limit=1 << 20, in_memory=64)
    again.write(b'{"a":1}\n' * 50)
    assert again.publish() == landed  # same bytes: the file there is left alone
    assert [p.name for p in (tmp_path / "land").iterdir()] == [landed.path.name]


def gzip_push(client: httpx.Client, payload: bytes, key: str) -> httpx.Response:
    return client.post(
        "/v1/connectors/push/records",
        content=payload,
        headers={**NDJSON, "Content-Encoding": "gzip", "Idempotency-Key": key},
    )


def test_a_multi_member_gzip_body_lands_every_member(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig]
) -> None:
    first = body({"type": "indicator", "id": "mm-1", "name": "one"})
    second = body({"type": "indicator", "id": "mm-2", "name": "two"}, {"type": "indicator", "id": "mm-3", "name": "3"})
    answer = gzip_push(client, gzip.compress(first) + gzip.compress(second), "multi-member")
    assert answer.status_code == 202, answer.text
    assert answer.json()["lines"] == 3
    landed = served[1].connector("push").path / Path(answer.json()["path"]).name  # type: ignore[operator]
    assert landed.read_bytes() == first + second
    empty_member = gzip_push(client, gzip.compress(first) + gzip.compress(b""), "multi-member-empty")
    assert empty_member.status_code == 202 and empty_member.json()["bytes"] == len(first)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda z: z[: len(z) // 2], "truncated"),
        (lambda z: z[:-4], "truncated"),  # the size trailer is missing
        (lambda z: z + b"garbage after the member", "trailing"),
        (lambda z: z + b"\0" * 8, "trailing"),
        (lambda z: z + gzip.compress(b'{"id": "tail"}\n')[:12], "truncated"),  # a cut second member
    ],
    ids=["half", "no-trailer", "garbage", "zeros", "cut-second-member"],
)
def test_a_truncated_or_trailing_garbage_gzip_body_is_400_and_lands_nothing(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig], pg_url: str, damage: Any, reason: str
) -> None:
    records = [{"type": "indicator", "id": f"cut-{i}", "name": f"n{i}"} for i in range(60)]
    compressed = gzip.compress(body(*records))
    before = landed_files(served[1])
    key = f"damaged-{reason}-{len(damage(compressed))}"
    answer = gzip_push(client, damage(compressed), key)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert reason in error and "\n" not in error
    assert landed_files(served[1]) == before  # no file, no spool
    assert ledger_row(pg_url, "http:push", key) is None


def flood(url: str, opening: bytes, limit: int = 64 << 20, seconds: float = 20.0) -> str:
    """Send ``opening`` then up to ``limit`` bytes of one endless header (or request line)
    on a loopback socket; what the server did about it: ``refused`` (it answered 400 or
    closed the connection) or ``accepted <n> bytes``."""
    host, port = url.removeprefix("http://").split(":")
    chunk = b"a" * (1 << 16)
    sent = 0
    deadline = time.monotonic() + seconds
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(opening)
            while sent < limit and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += len(chunk)
            answer = sock.recv(64)
        except OSError:  # reset or broken pipe: the server closed it
            return "refused"
    return "refused" if answer == b"" or answer.startswith(b"HTTP/1.1 400") else f"accepted {sent} bytes"


def test_an_oversized_header_or_request_line_is_refused_and_healthz_keeps_answering(
    client: httpx.Client, served: tuple[BackgroundServer, IdemConfig]
) -> None:
    openings = [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "] * 3 + [b"GET /healthz?"]
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda o=o: outcomes.append(flood(served[0].url, o))) for o in openings]
    for thread in threads:
        thread.start()
    try:
        for _ in range(5):
            started = time.monotonic()
            assert client.get("/healthz", timeout=5).status_code == 200
            assert time.monotonic() - started < 2
            time.sleep(0.2)
    finally:
        for thread in threads:
            thread.join(timeout=60)
    assert outcomes == ["refused"] * 4
    assert client.get("/healthz").status_code == 200


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which plain open() and mkdir() make 0644 files and 0755 directories."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_landed_bodies_their_spools_and_the_directories_made_for_them_are_private(
    pg_url: str, tmp_path: Path, umask_022: None
) -> None:
    from idem_platform.sources.push.landing import Spool

    spool = Spool(tmp_path / "made" / "land", limit=1 << 20, in_memory=8)
    spool.write(b'{"a":1}\n' * 4)  # past in_memory: spilled to its dotfile
    assert mode(spool.path) == 0o600
    assert mode(tmp_path / "made") == mode(tmp_path / "made" / "land") == 0o700
    assert mode(spool.publish().path) == 0o600
    config = push_config(tmp_path)
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    try:
        answer = httpx.post(f"{server.url}/v1/connectors/push/records", content=body({"id": "mode"}), headers=NDJSON)
    finally:
        server.stop()
    assert answer.status_code == 202
    directory = config.connector("push").path
    assert directory is not None and mode(directory) == mode(directory.parent) == 0o700
    assert mode(directory / Path(answer.json()["path"]).name) == 0o600


def test_a_spool_left_by_a_killed_server_is_removed_at_start_and_a_live_ones_is_not(
    pg_url: str, tmp_path: Path
) -> None:
    from idem_platform.sources.push.landing import Spool

    config = push_config(tmp_path)
    directory = config.connector("push").path
    assert directory is not None
    directory.mkdir(parents=True)
    stale = directory / ".push-0f0e0d0c0b0a09080706050403020100.tmp"  # as kill -9 mid-request leaves it
    stale.write_bytes(b'{"id": "half"}\n{"id": "ha')
    live = Spool(directory, limit=1 << 20, in_memory=0)  # another server, still receiving its body
    live.write(b'{"id": "live"}\n')
    server = serve_in_background(ServeSettings(config=config, postgres_url=pg_url))
    server.stop()
    assert not stale.exists()
    assert live.path.exists()
    landed = live.publish()
    assert landed.path.read_bytes() == b'{"id": "live"}\n'
    assert sorted(p.name for p in directory.iterdir()) == [landed.path.name]
