"""The write path as the ``ingest`` -> ``committed`` assets run it, called in process: plan,
coerce on Spark, commit. Shared by the pipeline, contract-mode and read-path tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from idem_platform.config import IdemConfig
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.samples import write_lines


def ingest(url: str, config: IdemConfig, spark: Any, *paths: Path, replay: bool = False, use_spark: bool = True) -> dict[str, Any]:
    """Commit the example's ``threatfeed`` files ``paths`` as one batch; its summary.

    ``use_spark=False`` fails the test if the batch asks for a Spark session (a replay
    must not need one)."""
    connector = config.connector("threatfeed")
    batch = pipeline.plan_batch(url, connector, list(paths))
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))

    def session() -> Any:
        if not use_spark:
            raise AssertionError("Spark was needed for a batch that should replay")
        return spark

    request = run.CommitRequest(url=url, connector=connector, run_id="test", replay=replay)
    return run.commit_batch(request, coerced, session)


def ingest_records(url: str, config: IdemConfig, spark: Any, connector_name: str, file: str, records: list[Any]) -> dict[str, Any]:
    """Write ``records`` (JSON values, or lines as they are) as ``file`` in the connector's drop
    directory and commit it: tables prepared, planned, coerced on Spark; its summary."""
    connector = config.connector(connector_name)
    assert connector.path is not None
    path = write_lines(connector.path / file, [r if isinstance(r, str) else json.dumps(r) for r in records])
    return commit_files(url, config, spark, connector_name, [path])


def commit_files(url: str, config: IdemConfig, spark: Any, connector_name: str, paths: list[Path]) -> dict[str, Any]:
    """Commit the files ``paths`` (already in the connector's drop directory) as one batch
    (the planner puts them in its own order): tables prepared, planned, coerced on Spark; its summary."""
    connector = config.connector(connector_name)
    pipeline.prepare_tables(url, config, connector)
    batch = pipeline.plan_batch(url, connector, paths)
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))
    request = run.CommitRequest(url=url, connector=connector, run_id="test", replay=False)
    return run.commit_batch(request, coerced, lambda: spark)
