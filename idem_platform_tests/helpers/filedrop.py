"""The example's file drop in tests: its directory, and the run its sensor launches for a
file dropped there, run without the sensor."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from idem_platform.config import IdemConfig
from idem_platform.config.connectors import FileDropConnector

if TYPE_CHECKING:
    import dagster as dg


def drop_dir(config: IdemConfig) -> Path:
    """The ``threatfeed`` connector's drop directory, made if missing (the sensor makes it on
    its first tick; a test that drops a file before any tick needs it now)."""
    connector = config.connector("threatfeed")
    assert isinstance(connector, FileDropConnector) and connector.path is not None
    connector.path.mkdir(parents=True, exist_ok=True)
    return connector.path


def run_file_partition(
    defs: dg.Definitions, instance: dg.DagsterInstance, config: IdemConfig, path: Path, **options: Any
) -> dg.ExecuteInProcessResult:
    """Run the ``threatfeed`` connector's job on the partition of the dropped file ``path``, as
    the file-drop sensor's run would (its partition added first, the file named in the run
    config), without ticking the sensor; ``options`` go to ``execute_in_process``."""
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
