"""The daemon's part in sensor tests: tick a sensor on a real instance and run what it requests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from idem_platform.config import IdemConfig

if TYPE_CHECKING:
    import dagster as dg


class SensorTicker:
    """Evaluates a sensor tick after tick on a real instance, carrying the cursor and the
    dynamic partitions it asks for like the daemon does, and runs what it requests."""

    def __init__(self, config: IdemConfig, instance: dg.DagsterInstance, pg_url: str, sensor: str) -> None:
        import dagster as dg

        from idem_platform.defs.definitions import build_definitions

        self.defs = build_definitions(config, postgres_url=pg_url)
        self.sensor = self.defs.resolve_sensor_def(sensor)
        self.instance = instance
        self.pg_url = pg_url
        self.cursor: str | None = None
        self._dg = dg

    def tick(self) -> dg.SensorResult:
        """One evaluation, as the daemon makes it: the cursor carried, the partitions it asks for added."""
        dg = self._dg
        from idem_platform.defs.resources import POSTGRES_KEY, PostgresResource

        context = dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={POSTGRES_KEY: PostgresResource(url=self.pg_url)},
            definitions=self.defs,
        )
        result = self.sensor(context)
        if isinstance(result, dg.SkipReason):
            return dg.SensorResult(skip_reason=result, cursor=self.cursor)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor or self.cursor
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def run(self, request: dg.RunRequest, job: str) -> dg.ExecuteInProcessResult:
        """Execute a requested run as the daemon would (same job, run config and tags)."""
        return self.defs.resolve_job_def(job).execute_in_process(
            instance=self.instance,
            run_config=request.run_config,
            tags=request.tags,
            partition_key=request.partition_key,
            raise_on_error=False,
        )


def run_file_partition(
    defs: dg.Definitions, instance: dg.DagsterInstance, config: IdemConfig, path: Path, **options: Any
) -> dg.ExecuteInProcessResult:
    """Run the ``threatfeed`` connector's job on the partition of the dropped file ``path``, as
    the file-drop sensor's run would (its partition added first, the file named in the run
    config), without ticking the sensor; ``options`` go to ``execute_in_process``."""
    from idem_platform.config.connectors import FileDropConnector
    from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for

    connector = config.connector("threatfeed")
    assert isinstance(connector, FileDropConnector)
    key = partition_key_for(connector, path)
    instance.add_dynamic_partitions(partitions_for(connector).name or "", [key])
    return defs.resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance,
        partition_key=key,
        run_config={"ops": {"threatfeed__ingest": {"config": {"files": [str(path)]}}}},
        **options,
    )
