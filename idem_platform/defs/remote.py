"""A connector's job launched through a Dagster webserver, as the UI launches it.

``idem ingest --dagster URL`` (or ``$IDEM_DAGSTER_URL``) does not execute the job in its
own process: it asks the webserver's GraphQL API to launch it in the code location that
defines the connector, waits for the run, and reads the commit summary back from the
run's ``committed`` materialization. Such a run has everything a run the UI or a sensor
launches has: it is queued by the instance's run coordinator (so it counts against the
run queue's limits), runs in the code location's own environment, appears in the job's
run history and the Overview timeline, and can be re-executed from the UI.

Only public interfaces are used: ``dagster_graphql.DagsterGraphQLClient`` submits the run
and reads its status; the three reads it has no method for (which code location defines
the job, adding the run's dynamic partition, the run's materializations and failure) are
GraphQL queries posted to the same endpoint.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from idem_platform.config import ConnectorConfig, FileConnector, IdemConfig
from idem_platform.defs.connector.names import asset_keys, job_name
from idem_platform.defs.filedrop.partitions import partitions_for
from idem_platform.defs.rejects import retry_job_name, retry_op_name
from idem_platform.defs.summary import summary_from_metadata
from idem_platform.errors import TerminalError

# Dagster's documented tag of a run's partition.
PARTITION_TAG = "dagster/partition"

TERMINAL = {"SUCCESS": True, "FAILURE": False, "CANCELED": False}
POLL_SECONDS = 0.5

_JOBS = """
query IdemJobs { repositoriesOrError { __typename ... on RepositoryConnection { nodes {
  name location { name } jobs { name } } } ... on PythonError { message } } }
"""
_ADD_PARTITION = """
mutation IdemAddPartition($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name, partitionKey: $key) {
    __typename ... on PythonError { message } ... on UnauthorizedError { message } } }
"""
_RESULT = """
query IdemRunResult($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run {
  status assetMaterializations { assetKey { path } metadataEntries { label __typename
    ... on IntMetadataEntry { intValue intRepr } ... on FloatMetadataEntry { floatValue }
    ... on BoolMetadataEntry { boolValue } ... on TextMetadataEntry { text }
    ... on JsonMetadataEntry { jsonString } ... on MarkdownMetadataEntry { mdStr }
    ... on PathMetadataEntry { path } } } } } }
"""
_OUTPUTS = """
query IdemRunOutputs($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection {
  events { __typename ... on ExecutionStepOutputEvent { stepKey metadataEntries { label __typename
    ... on JsonMetadataEntry { jsonString } } } } } } }
"""
_FAILURE = """
query IdemRunFailure($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection {
  events { __typename ... on ExecutionStepFailureEvent { stepKey error { message className
    cause { message className } } } ... on RunFailureEvent { message } } } } }
"""


class RemoteRunFailed(TerminalError):
    """The webserver refused the launch, or the run it launched did not succeed."""


@dataclass(frozen=True)
class Webserver:
    """A Dagster webserver's GraphQL endpoint, from the URL a person gives (``http://host:3000``)."""

    url: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteRunFailed(f"--dagster {self.url!r}: not a webserver URL (http://host:port)")

    def client(self) -> DagsterGraphQLClient:
        """Dagster's own GraphQL client for this webserver."""
        parts = urlsplit(self.url)
        return DagsterGraphQLClient(
            parts.hostname or "", port_number=parts.port, use_https=parts.scheme == "https",
            path_prefix=parts.path.rstrip("/"),
        )

    def query(self, query: str, variables: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` of a GraphQL answer; an unreachable webserver or an error is one line."""
        body = json.dumps({"query": query, "variables": dict(variables)}).encode()
        endpoint = self.url.rstrip("/") + "/graphql"
        request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - the URL the person gave
                answer = json.loads(response.read())
        except (OSError, ValueError) as error:
            raise RemoteRunFailed(f"the Dagster webserver at {self.url} did not answer: {error}") from None
        if answer.get("errors"):
            raise RemoteRunFailed(f"the Dagster webserver at {self.url} refused a query: {answer['errors'][0].get('message')}")
        return dict(answer["data"])


def locate_job(server: Webserver, job: str) -> tuple[str, str]:
    """``(code location, repository)`` of the one loaded code location that defines ``job``.

    Raises:
        RemoteRunFailed: no location defines it, or several do.
    """
    answer = server.query(_JOBS, {})["repositoriesOrError"]
    if answer["__typename"] != "RepositoryConnection":
        raise RemoteRunFailed(f"the Dagster webserver at {server.url} cannot list its code locations: {answer.get('message')}")
    found = [(n["location"]["name"], n["name"]) for n in answer["nodes"] if any(j["name"] == job for j in n["jobs"])]
    if not found:
        raise RemoteRunFailed(f"no code location of the Dagster webserver at {server.url} defines the job {job}")
    if len(found) > 1:
        where = ", ".join(location for location, _ in found)
        raise RemoteRunFailed(f"the job {job} is defined by several code locations ({where}): rename one connector")
    return found[0]


def add_partition(server: Webserver, where: tuple[str, str], partitions: str, key: str) -> None:
    """Add the run's file partition to the connector's dynamic partitions (kept if it exists)."""
    selector = {"repositoryLocationName": where[0], "repositoryName": where[1]}
    answer = server.query(_ADD_PARTITION, {"selector": selector, "name": partitions, "key": key})["addDynamicPartition"]
    if answer["__typename"] not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
        raise RemoteRunFailed(f"the webserver did not add the partition {key!r}: {answer.get('message')}")


def launch_and_wait(
    server: Webserver, where: tuple[str, str], job: str, run_config: dict[str, Any], tags: dict[str, str],
    *, timeout: float | None = None,
) -> str:
    """Submit ``job`` in its code location and wait until the run ends; its run id.

    Raises:
        RemoteRunFailed: the launch was refused, the run failed or was canceled, or it did
            not end within ``timeout`` seconds, when one is given (it keeps running: its id
            is in the message).
    """
    client = server.client()
    try:
        run_id = client.submit_job_execution(
            job, repository_location_name=where[0], repository_name=where[1], run_config=run_config, tags=tags
        )
    except DagsterGraphQLClientError as error:
        raise RemoteRunFailed(f"the Dagster webserver at {server.url} did not launch {job}: {error}") from None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = client.get_run_status(run_id).value
        if status in TERMINAL:
            if not TERMINAL[status]:
                raise RemoteRunFailed(f"run {run_id} of {job}: {failure_line(server, run_id, status)}")
            return run_id
        if deadline is not None and time.monotonic() > deadline:
            raise RemoteRunFailed(f"run {run_id} of {job} is still {status.lower()} after {timeout} s (it goes on)")
        time.sleep(POLL_SECONDS)


def failure_line(server: Webserver, run_id: str, status: str) -> str:
    """The run's first failed step and its innermost error's first line, else its status."""
    logs = server.query(_FAILURE, {"runId": run_id})["logsForRun"]
    for event in logs.get("events") or []:
        error = event.get("error")
        if event["__typename"] == "ExecutionStepFailureEvent" and error:
            inner = error["cause"] or error
            lines = (inner["message"] or inner["className"]).strip().splitlines() or [inner["className"]]
            return f"{event['stepKey']}: {lines[0]}"
    return f"the run ended {status.lower()} (see its logs in the Dagster UI)"


def materialization_metadata(server: Webserver, run_id: str, asset_path: list[str]) -> dict[str, Any]:
    """The metadata of the run's materialization of ``asset_path``, as plain values.

    Raises:
        RemoteRunFailed: the run recorded no such materialization.
    """
    run = server.query(_RESULT, {"runId": run_id})["runOrError"]
    for materialization in run.get("assetMaterializations") or []:
        if materialization["assetKey"]["path"] == asset_path:
            return {entry["label"]: _plain(entry) for entry in materialization["metadataEntries"]}
    raise RemoteRunFailed(f"run {run_id} succeeded but recorded no materialization of {'/'.join(asset_path)}")


def _plain(entry: Mapping[str, Any]) -> Any:
    """A GraphQL metadata entry's value as Python (JSON parsed; ``intRepr`` for ints past 32 bits)."""
    kind = entry["__typename"]
    if kind == "IntMetadataEntry":
        return int(entry["intRepr"])
    if kind == "JsonMetadataEntry":
        return json.loads(entry["jsonString"])
    for field in ("floatValue", "boolValue", "text", "mdStr", "path"):
        if field in entry:
            return entry[field]
    return None


def launch_ingest_job(
    url: str, config: IdemConfig, connector: ConnectorConfig, ingest_config: dict[str, Any], partition: str | None,
    *, replay: bool,
) -> dict[str, Any]:
    """Launch the connector's ingest job through the webserver at ``url``, wait, and return
    its commit summary (what :func:`~idem_platform.defs.inprocess.run_ingest_job` returns
    for a run in process), with ``run_id`` and ``dagster`` (the webserver) added.

    Raises:
        RemoteRunFailed: see :func:`launch_and_wait`.
    """
    server = Webserver(url)
    job = job_name(connector)
    where = locate_job(server, job)
    tags = {"idem/replay": "true"} if replay else {}
    if partition is not None and isinstance(connector, FileConnector):
        add_partition(server, where, partitions_for(connector).name or "", partition)
        tags[PARTITION_TAG] = partition
    ingest_key, _, committed_key = asset_keys(connector)
    run_config = {"ops": {ingest_key.to_python_identifier(): {"config": ingest_config}}}
    run_id = launch_and_wait(server, where, job, run_config, tags)
    metadata = materialization_metadata(server, run_id, list(committed_key.path))
    summary = summary_from_metadata(metadata, getattr(connector, "path", None))
    return {**summary, "run_id": run_id, "dagster": f"{url.rstrip('/')}/runs/{run_id}"}


def launch_retry_job(url: str, connector: ConnectorConfig, *, commit: str | None, dry_run: bool) -> dict[str, Any]:
    """Launch the connector's ``<connector>_retry_rejects`` job through the webserver at
    ``url``, wait, and return its summary (the op's ``summary`` output metadata), with
    ``run_id`` and ``dagster`` added.

    Raises:
        RemoteRunFailed: see :func:`launch_and_wait`.
    """
    server = Webserver(url)
    job = retry_job_name(connector)
    where = locate_job(server, job)
    run_config = {"ops": {retry_op_name(connector): {"config": {"commit_id": commit, "dry_run": dry_run}}}}
    run_id = launch_and_wait(server, where, job, run_config, {})
    logs = server.query(_OUTPUTS, {"runId": run_id})["logsForRun"]
    for event in logs.get("events") or []:
        for entry in event.get("metadataEntries") or []:
            if entry["label"] == "summary" and entry["__typename"] == "JsonMetadataEntry":
                return {**json.loads(entry["jsonString"]), "run_id": run_id, "dagster": f"{url.rstrip('/')}/runs/{run_id}"}
    raise RemoteRunFailed(f"run {run_id} succeeded but recorded no retry summary")
