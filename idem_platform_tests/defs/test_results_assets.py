"""An effect's results table as a Dagster asset (idem_platform.defs.results): ``idem/<results_table>``
in the code location's asset graph, downstream of its record type's table, materialized by each
delivery run that recorded answers, and read by a user's asset as a Spark DataFrame through
``dg.materialize``. Real PostgreSQL, Spark, Dagster and a loopback receiver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from pyspark.sql import DataFrame

from idem_platform.config import parse_config
from idem_platform.defs.definitions import build_definitions, resources_for
from idem_platform.defs.effects import JOB_NAME
from idem_platform.defs.results import results_asset_specs
from idem_platform.defs.tables import TABLE_IO_MANAGER, table_key
from idem_platform.errors import ConfigError
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.effects import alert, effects_config
from idem_platform_tests.helpers.filedrop import drop_dir, run_file_partition
from idem_platform_tests.helpers.receiver import Reply, receiving

RESULTS = table_key("indicator_enrichment")
LINES = [
    '{"type":"indicator","id":"h1","name":"high.example","confidence":90}',
    '{"type":"indicator","id":"h2","name":"higher.example","confidence":95}',
    '{"type":"indicator","id":"l1","name":"low.example","confidence":10}',
]


def enrichment(url: str) -> dict[str, Any]:
    return alert(url, name="enrich", results_table="indicator_enrichment")


def with_effect(effect: dict[str, Any], text: str | None = None) -> str:
    """The example's idem.yaml (or ``text``) with the one effect ``effect``."""
    data = yaml.safe_load(text or example_text())
    data["effects"] = [effect]
    return yaml.safe_dump(data, sort_keys=False)


def test_the_results_table_is_an_asset_downstream_of_its_record_table(tmp_path: Path) -> None:
    config = parse_config(with_effect(enrichment("http://127.0.0.1:9/enrich")), tmp_path / "idem.yaml")
    defs = build_definitions(config, postgres_url="postgresql://postgres@127.0.0.1:5432/postgres")
    graph = defs.resolve_asset_graph()
    node = graph.get(RESULTS)
    assert [k.to_user_string() for k in node.parent_keys] == ["idem/indicator"]
    # Loadable by the tables' IO manager, never materializable: only deliveries write it.
    assert not node.is_materializable and not node.is_executable
    assert node.group_name == "idem_tables" and node.tags["idem/effect"] == "enrich"
    assert defs.resolve_assets_def(RESULTS).get_io_manager_key_for_asset_key(RESULTS) == TABLE_IO_MANAGER
    metadata = defs.resolve_assets_def(RESULTS).metadata_by_key[RESULTS]
    assert metadata["dagster/table_name"] == "idem.indicator_enrichment"
    assert [c.name for c in metadata["dagster/column_schema"].columns] == [
        "key", "effect", "record_type", "external_id", "record_key", "response", "status", "delivered_at",
    ]
    assert "AssetIn(['idem', 'indicator_enrichment'])" in str(node.description)


def test_a_connector_named_idem_cannot_shadow_a_results_table(tmp_path: Path) -> None:
    effect = {**enrichment("http://127.0.0.1:9/enrich"), "results_table": "committed"}
    text = with_effect(effect, example_text().replace("name: threatfeed", "name: idem"))
    config = parse_config(text, tmp_path / "idem.yaml")
    with pytest.raises(ConfigError, match="results table 'committed' and connector 'idem' would both be the Dagster asset idem/committed"):
        results_asset_specs(config)


def test_a_delivery_materializes_the_results_table_and_a_user_asset_reads_it(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    received: dict[str, Any] = {}

    @dg.asset(ins={"enrichment": dg.AssetIn(RESULTS)})
    def verdicts(enrichment: DataFrame) -> dg.MaterializeResult:
        rows = enrichment.select("external_id", "effect", "response", "status", "record_key").collect()
        received["rows"] = sorted((r["external_id"], r["effect"], json.loads(r["response"]), r["status"]) for r in rows)
        received["record_keys"] = {r["record_key"] for r in rows}
        return dg.MaterializeResult(metadata={"rows": len(rows)})

    @dg.asset(ins={"enrichment": dg.AssetIn(RESULTS, metadata={"limit": 1})})
    def first_verdict(enrichment: DataFrame) -> None:
        received["limited"] = enrichment.count()

    with receiving(lambda key, seen: Reply(200, body='{"verdict":"malicious"}')) as receiver:
        config = effects_config(tmp_path, pg_url, [enrichment(receiver.url)])
        defs = build_definitions(config, postgres_url=pg_url)
        resources = resources_for(config, postgres_url=pg_url)
        specs = results_asset_specs(config)

        def read_with(asset: dg.AssetsDefinition) -> dg.ExecuteInProcessResult:
            return dg.materialize([*specs, asset], selection=[asset.key], resources=resources, instance=instance)

        before = read_with(verdicts)  # no dispatcher ran yet: the table does not exist, the frame is empty
        assert before.success and received["rows"] == []

        ingest = run_file_partition(defs, instance, config, write_lines(drop_dir(config) / "today.ndjson", LINES))
        assert ingest.success
        delivered = defs.resolve_job_def(JOB_NAME).execute_in_process(instance=instance)
    assert delivered.success
    (event,) = [m for m in delivered.get_asset_materialization_events() if m.asset_key == RESULTS]
    metadata = event.materialization.metadata
    assert metadata["dagster/row_count"].value == 2 and metadata["rows_written"].value == 2
    assert instance.get_latest_materialization_event(RESULTS) is not None

    result = read_with(verdicts)
    assert result.success
    assert received["rows"] == [
        ("h1", "enrich", {"verdict": "malicious"}, 200),
        ("h2", "enrich", {"verdict": "malicious"}, 200),
    ]
    assert all(k.startswith("threatfeed:indicator:h") for k in received["record_keys"])
    (observation,) = result.asset_observations_for_node("verdicts")
    assert observation.asset_key == RESULTS and observation.metadata["rows"].value == 2
    assert read_with(first_verdict).success and received["limited"] == 1

    # Through the code location's own definitions too, as the UI's "Materialize" runs it.
    job = dg.Definitions.merge(defs, dg.Definitions(assets=[verdicts])).resolve_implicit_job_def_def_for_assets([verdicts.key])
    assert job is not None
    received["rows"] = []
    assert job.execute_in_process(instance=instance, asset_selection=[verdicts.key]).success
    assert len(received["rows"]) == 2
