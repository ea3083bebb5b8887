"""The file-drop ``ingest`` asset reads only its drop directory, whatever a run's config says.

Anyone who can launch a run in the UI writes its config: without this, ``files:
[/etc/shadow]`` would have the code server read any file it can, and show its lines
back as rejects. Runs go through Dagster's own API here, as the Launchpad and the
daemon launch them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions, resources_for
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.filedrop import drop_dir

RECORD = '{"type":"malware","id":"m1","name":"x"}'


def launch(
    config: IdemConfig, pg_url: str, instance: dg.DagsterInstance, files: list[str], partition: str = "launchpad"
) -> dg.ExecuteInProcessResult:
    """A run of the connector's job as the Launchpad (or the sensor) launches it: this run config."""
    defs = build_definitions(config, postgres_url=pg_url)
    instance.add_dynamic_partitions(partitions_for(config.connector("threatfeed")).name or "", [partition])
    return defs.resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance,
        partition_key=partition,
        run_config={"ops": {"threatfeed__ingest": {"config": {"files": files}}}},
        raise_on_error=False,
    )


def refusal(result: dg.ExecuteInProcessResult) -> tuple[str, dict[str, Any]]:
    """The failed ``ingest`` step's description and metadata (a ``dg.Failure``)."""
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "threatfeed__ingest"
    data = failure.step_failure_data.user_failure_data
    assert data is not None, failure.step_failure_data.error
    return data.description or "", {k: v.value for k, v in data.metadata.items()}


def nothing_committed(pg_url: str) -> bool:
    with connect(pg_url) as conn:
        counts = [conn.execute(f"SELECT count(*) FROM idem.{t}").fetchone()[0] for t in ("commits", "ingest_ledger", "rejects")]
    return counts == [0, 0, 0]


@pytest.mark.timeout(120)  # a FIFO opened for reading would block the run for ever
def test_files_outside_the_drop_directory_are_refused_naming_the_entry(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    directory = drop_dir(threatfeed)
    outside = write_lines(tmp_path / "outside" / "secret.ndjson", [RECORD])
    (directory / "link.ndjson").symlink_to(outside)
    os.mkfifo(directory / "pipe.ndjson")
    shown = threatfeed.shown(directory)
    cases = {
        str(outside): f"files[0] {str(outside)!r}: outside the drop directory ({shown}): refused",
        "../../outside/secret.ndjson": f"files[0] '../../outside/secret.ndjson': outside the drop directory ({shown}): refused",
        "link.ndjson": f"files[0] 'link.ndjson': a symlink out of the drop directory (to {outside.resolve()}): refused",
        "pipe.ndjson": "files[0] 'pipe.ndjson': a FIFO, not a regular file: refused",
        "/dev/null": f"files[0] '/dev/null': outside the drop directory ({shown}): refused",
    }
    for entry, message in cases.items():
        result = launch(threatfeed, pg_url, instance, [entry])
        assert not result.success
        description, metadata = refusal(result)
        assert description == message
        assert metadata["entry"] == entry and metadata["drop_directory"] == shown
    # A good file first does not let a bad one through: the run names the bad entry.
    good = write_lines(directory / "good.ndjson", [RECORD])
    description, _ = refusal(launch(threatfeed, pg_url, instance, [str(good), str(outside)]))
    assert description.startswith(f"files[1] {str(outside)!r}: outside the drop directory")
    assert nothing_committed(pg_url)


def test_a_partition_whose_file_leads_out_is_refused(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    """The UI's "Materialize" of a partition (no files in the config) gets the same rules."""
    directory = drop_dir(threatfeed)
    outside = write_lines(tmp_path / "elsewhere" / "x.ndjson", [RECORD])
    (directory / "sub").symlink_to(outside.parent, target_is_directory=True)
    defs = build_definitions(threatfeed, postgres_url=pg_url)
    instance.add_dynamic_partitions(partitions_for(threatfeed.connector("threatfeed")).name or "", ["sub/x.ndjson"])
    result = defs.resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance, partition_key="sub/x.ndjson", raise_on_error=False
    )
    description, _ = refusal(result)
    assert description == f"partition 'sub/x.ndjson': a symlink out of the drop directory (to {outside.resolve()}): refused"
    assert nothing_committed(pg_url)


def test_sensor_style_absolute_paths_and_relative_paths_inside_still_run(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    directory = drop_dir(threatfeed)
    first = write_lines(directory / "a.ndjson", [RECORD])
    write_lines(directory / "nested" / "b.ndjson", ['{"type":"malware","id":"m2","name":"y"}'])
    # What the sensor passes: the absolute path of a file in the drop directory.
    result = launch(threatfeed, pg_url, instance, [str(first)], partition=partition_key_for(threatfeed.connector("threatfeed"), first))
    assert result.success
    # What a person types in the Launchpad: a path relative to the drop directory.
    instance.add_dynamic_partitions(partitions_for(threatfeed.connector("threatfeed")).name or "", ["launchpad"])
    materialized = dg.materialize(
        [a for a in build_definitions(threatfeed).assets if isinstance(a, dg.AssetsDefinition)],  # type: ignore[union-attr]
        instance=instance,
        resources=resources_for(threatfeed, postgres_url=pg_url),
        partition_key="launchpad",
        run_config={"ops": {"threatfeed__ingest": {"config": {"files": ["nested/b.ndjson"]}}}},
    )
    assert materialized.success
    (event,) = [m for m in materialized.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    assert event.metadata["rows_written"].value == 1
    assert event.metadata["files"].value[0]["file"] == "nested/b.ndjson"  # as the Launchpad names it
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (2,)
