"""The daemon's part in sensor tests: tick a sensor on a real instance and run what it requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
