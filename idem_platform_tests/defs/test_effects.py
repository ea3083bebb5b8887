"""Effects in Dagster (idem_platform.defs.effects): the sensor launches ``idem_effects_deliver`` when
rows are due and skips otherwise, the job delivers them, and ``effects_owed`` on the table asset
turns from warn to pass. Real PostgreSQL, Spark, Dagster and a loopback receiver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.effects import CHECK_NAME, JOB_NAME, OP_NAME, SENSOR_NAME
from idem_platform.defs.resources import POSTGRES_KEY, PostgresResource
from idem_platform.defs.tables import table_key
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.filedrop import drop_dir, run_file_partition
from idem_platform_tests.helpers.receiver import Reply, receiving

INDICATOR = table_key("indicator")
LINES = [
    '{"type":"indicator","id":"h1","name":"high","confidence":90}',
    '{"type":"indicator","id":"l1","name":"low","confidence":10}',
]


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, pg_url: str) -> dg.RunRequest | dg.SkipReason:
    """One evaluation of the effects sensor, as the daemon makes it."""
    context = dg.build_sensor_context(
        instance=instance, resources={POSTGRES_KEY: PostgresResource(url=pg_url)}, definitions=defs
    )
    result = defs.resolve_sensor_def(SENSOR_NAME)(context)
    assert isinstance(result, (dg.RunRequest, dg.SkipReason)), result
    return result


def ingest(config: IdemConfig, defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Drop a file and run the connector's job on its partition, as the file-drop sensor's run would."""
    result = run_file_partition(defs, instance, config, write_lines(drop_dir(config) / "today.ndjson", LINES))
    assert result.success
    return result


def owed_check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == CHECK_NAME]
    assert evaluation.asset_key == INDICATOR and evaluation.severity == dg.AssetCheckSeverity.WARN
    return evaluation


def value(evaluation: dg.AssetCheckEvaluation, name: str) -> Any:
    return evaluation.metadata[name].value


def test_the_sensor_launches_the_job_which_delivers_and_the_check_turns_from_warn_to_pass(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    with receiving(lambda key, seen: Reply(200)) as receiver:
        # Warn on any pending row older than 10 ms: a commit's row is owed for longer than that.
        config = effects_config(tmp_path, pg_url, [alert(receiver.url, warn_pending_after_seconds=0.01)])
        defs = build_definitions(config, postgres_url=pg_url)
        job = defs.resolve_job_def(JOB_NAME)
        assert job.executor_def is dg.in_process_executor
        assert {c.name for c in defs.resolve_asset_graph().get_check_keys_for_assets({INDICATOR})} == {CHECK_NAME}

        skipped = tick(defs, instance, pg_url)
        assert isinstance(skipped, dg.SkipReason) and skipped.skip_message == "nothing due: 0 pending (not due yet or claimed), 0 failed"

        committed = ingest(config, defs, instance)
        after_commit = owed_check(committed)  # evaluated by the commit that added to what is owed
        assert not after_commit.passed
        assert (value(after_commit, "alert/pending"), value(after_commit, "alert/delivered")) == (1, 0)
        assert "alert: oldest pending row is" in value(after_commit, "problems")[0]

        request = tick(defs, instance, pg_url)
        assert isinstance(request, dg.RunRequest) and request.run_key
        again = tick(defs, instance, pg_url)
        assert isinstance(again, dg.RunRequest) and again.run_key == request.run_key  # one due set, one run

        queued = instance.create_run_for_job(job_def=job, run_config={}, tags={})  # a delivery run not ended yet
        busy = tick(defs, instance, pg_url)
        assert isinstance(busy, dg.SkipReason) and f"delivery run {queued.run_id} is in progress" in str(busy.skip_message)
        assert "1 due, 1 pending, 0 failed" in str(busy.skip_message)
        instance.report_run_canceled(queued)
        relaunch = tick(defs, instance, pg_url)  # that run ended without taking the due rows: launch again
        assert isinstance(relaunch, dg.RunRequest) and relaunch.run_key != request.run_key

        delivered = job.execute_in_process(instance=instance, run_config=request.run_config, tags=request.tags)
    assert delivered.success
    assert delivered.output_for_node(OP_NAME)["delivered"] == 1
    passed = owed_check(delivered)
    assert passed.passed and (value(passed, "alert/pending"), value(passed, "alert/delivered")) == (0, 1)
    assert value(passed, "alert/oldest_pending_seconds") is None
    (row,) = outbox(pg_url)
    assert row["status"] == "delivered" and receiver.keys() == [row["key"]]
    assert receiver.requests[0][1] == {"indicator": "high", "confidence": 90, "id": "h1"}
    nothing = tick(defs, instance, pg_url)
    assert isinstance(nothing, dg.SkipReason) and nothing.skip_message == "nothing due: 0 pending (not due yet or claimed), 0 failed"


def test_a_failed_row_warns_and_the_check_runs_on_its_own(tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any) -> None:
    with receiving(lambda key, seen: Reply(400)) as receiver:
        config = effects_config(tmp_path, pg_url, [alert(receiver.url)])
        defs = build_definitions(config, postgres_url=pg_url)
        ingest(config, defs, instance)
        job = defs.resolve_job_def(JOB_NAME)
        result = job.execute_in_process(instance=instance, run_config={"ops": {OP_NAME: {"config": {"effect": "alert"}}}})
    assert result.output_for_node(OP_NAME)["failed"] == 1
    warned = owed_check(result)
    assert not warned.passed and value(warned, "problems") == ["alert: 1 failed (idem effects list --status failed)"]
    skipped = tick(defs, instance, pg_url)
    assert isinstance(skipped, dg.SkipReason) and "0 pending (not due yet or claimed), 1 failed" in str(skipped.skip_message)
    # Executed on its own, as the UI's "Execute" does: a run of the check alone, its asset untouched.
    only_check = dg.define_asset_job("owed_alone", selection=dg.AssetSelection.checks(dg.AssetCheckKey(INDICATOR, CHECK_NAME)))
    alone = dg.Definitions.merge(defs, dg.Definitions(jobs=[only_check])).resolve_job_def("owed_alone").execute_in_process(
        instance=instance
    )
    assert not owed_check(alone).passed and value(owed_check(alone), "alert/failed") == 1
