"""The scale of file partitions (issue 35 item 8): one file-drop connector with N dynamic partitions.

    python benchmarks/partitions_bench.py [--partitions 20000] [--sizes 1000,5000,20000] [--repeat 3]
                                          [--postgres URL] [--workdir DIR] [--out results.json]

A file-drop connector has one dynamic partition per dropped file, so a year of hourly
drops is ~9,000 partitions. At each size N (successive sizes, the files of the
smaller ones kept) the connector has N small files on disk, each committed in the
ledger, its partition registered and its ``committed`` asset materialized; then:

* **tick**: the connector's sensor on the real instance (``build_sensor_context``, as
  the tests tick it, the daemon's part included: the partition it asks for is added)
  with the N files known and one new file dropped. A new file is requested on the
  second look (the first sees it, the second finds it unchanged): the tick timed is
  that second one, the one that hashes it, asks the ledger and requests its run;
  the first look is reported beside it;
* **page**: the GraphQL queries the asset page of ``<connector>/committed`` and its
  Partitions tab issue in Dagster 1.13's UI (``AssetGraphLiveQuery``'s partition
  stats, ``AssetViewDefinitionQuery``, ``PartitionHealthQuery``'s keys and statuses,
  ``AssetHealthQuery``), posted to a real ``dagster-webserver`` one after the other,
  as seconds for all of them and per query;
* **backfill**: ``launchPartitionBackfill`` of the connector's three assets over all
  partitions (the UI's "Materialize all"), until the backfill is created with its
  target subset; no daemon runs, so no run starts, and it is canceled at once.

Each figure is the median of ``--repeat`` rounds. The row ``0`` is the fixed cost: the
same with no partition but the new file's (no backfill: nothing to fill).

How the N files get there (not timed): the files are written and hashed, their ledger
rows written by idem's :class:`~idem_platform.ledger.Ledger` (``begin`` then ``commit``
with the result a commit records: the file's path, size, times and inode, which is what
tells the sensor a file is committed), in transactions of 1,000; the partitions are
added with ``instance.add_dynamic_partitions`` in sorted order (as the sensor adds
them) and each one's materialization of ``committed`` is reported with
``instance.report_runless_asset_event``: no Spark, so no table rows, which none of the
three figures reads.

Dagster's instance is idem's ``dagster.yaml`` (PostgreSQL storage) on a database of its
own, created afresh; idem's tables in another. Default PostgreSQL is the embedded one
(``benchmarks/data/.idem``, left running like the other benchmarks'); ``--postgres`` takes a
server URL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402
import yaml  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    CONFIG,
    REPO,
    embedded_server,
    exit_on_sigterm,
    fresh_database,
    machine_facts,
    server_facts,
)
from idem_platform.config import FileConnector, IdemConfig, load_config  # noqa: E402
from idem_platform.defs.connector.names import asset_keys, sensor_name  # noqa: E402
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for  # noqa: E402
from idem_platform.ledger import Ledger  # noqa: E402
from idem_platform.postgres import connect, ensure_schema  # noqa: E402
from idem_platform.samples import write_lines  # noqa: E402
from idem_platform.sources.filedrop import file_unit  # noqa: E402
from idem_platform.sources.filedrop.files import hash_file  # noqa: E402
from idem_platform_tests.helpers.sensors import SensorTicker  # noqa: E402
from idem_platform_tests.helpers.webserver import GraphQL, webserver  # noqa: E402

HERE = Path(__file__).resolve().parent
CONNECTOR = "threatfeed"
DATABASE, DAGSTER_DATABASE = "idem_partitions_bench", "idem_partitions_bench_dagster"
DEFAULT_SIZES = (1_000, 5_000, 20_000)

# The asset page and its Partitions tab, as Dagster 1.13.27's UI asks them (names and the
# fields that grow with the partitions, from the webserver's bundled JavaScript).
PAGE_QUERIES = {
    "AssetGraphLiveQuery": """query AssetGraphLiveQuery($assetKeys: [AssetKeyInput!]!) {
      assetNodes(assetKeys: $assetKeys, loadMaterializations: true) {
        id assetKey { path } assetMaterializations(limit: 1) { timestamp runId stepKey }
        partitionStats { numMaterialized numMaterializing numPartitions numFailed } }
      assetsLatestInfo(assetKeys: $assetKeys) { id unstartedRunIds inProgressRunIds latestRun { id status } } }""",
    "AssetViewDefinitionQuery": """query AssetViewDefinitionQuery($assetKey: AssetKeyInput!) {
      assetOrError(assetKey: $assetKey) { ... on Asset { id hasDefinitionOrRecord
        assetMaterializations(limit: 1) { timestamp runId }
        definition { id groupName partitionDefinition { description dimensionTypes { type dynamicPartitionsDefinitionName } }
          partitionKeysByDimension { name } } } } }""",
    "PartitionHealthQuery": """query PartitionHealthQuery($assetKey: AssetKeyInput!) {
      assetNodeOrError(assetKey: $assetKey) { ... on AssetNode { id
        partitionKeysByDimension { name type partitionKeys }
        assetPartitionStatuses { ... on DefaultPartitionStatuses {
          materializedPartitions materializingPartitions failedPartitions } } } } }""",
    "AssetHealthQuery": """query AssetHealthQuery($assetKeys: [AssetKeyInput!]!) {
      assetsOrError(assetKeys: $assetKeys) { ... on AssetConnection { nodes { id
        latestMaterializationTimestamp assetHealth { assetHealth materializationStatus } } } } }""",
}
LAUNCH_BACKFILL = """mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_PAGE = """query BackfillStatusesQuery($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) { ... on PartitionBackfill { id status numPartitions
    assetBackfillData { assetBackfillStatuses { ... on AssetPartitionsStatusCounts {
      assetKey { path } numPartitionsTargeted numPartitionsMaterialized numPartitionsFailed } } } } } }"""
CANCEL_BACKFILL = """mutation Cancel($backfillId: String!) {
  cancelPartitionBackfill(backfillId: $backfillId) { __typename } }"""


def median_of(repeat: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    """The median of ``repeat`` calls of ``measure`` (each returns its seconds), and all of them."""
    rounds = [measure() for _ in range(repeat)]
    return statistics.median(rounds), rounds


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def instance_home(workdir: Path, server: str) -> Path:
    """``DAGSTER_HOME`` with idem's ``dagster.yaml`` on a fresh database of its own (set in ``os.environ``:
    this process and the webserver it starts use the same instance)."""
    home = workdir / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    template = (REPO / "idem_platform" / "dagster.yaml").read_text(encoding="utf-8")
    (home / "dagster.yaml").write_text(
        template.replace("env: IDEM_POSTGRES_URL", "env: IDEM_PARTITIONS_BENCH_DAGSTER_URL"), encoding="utf-8"
    )
    os.environ["IDEM_PARTITIONS_BENCH_DAGSTER_URL"] = fresh_database(server, DAGSTER_DATABASE)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def write_config(workdir: Path) -> Path:
    """The benchmark's catalog: one file-drop connector on ``workdir/drop``."""
    data = yaml.safe_load(CONFIG)
    data["connectors"] = [{**data["connectors"][0], "name": CONNECTOR, "path": "drop"}]
    path = workdir / "idem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def file_path(directory: Path, index: int) -> Path:
    """Hourly drops: ``day-0000/hour-00.ndjson``... (index 24 is the next day)."""
    return directory / f"day-{index // 24:04d}" / f"hour-{index % 24:02d}.ndjson"


def grow(instance: dg.DagsterInstance, connector: FileConnector, url: str, start: int, stop: int) -> float:
    """Files ``start`` .. ``stop - 1`` written, committed in the ledger, their partitions added and
    ``committed`` materialized in each; the seconds it took (not a figure of the table)."""
    assert connector.path is not None
    started = time.perf_counter()
    committed_key = asset_keys(connector)[2]
    name = partitions_for(connector).name or ""
    for chunk in range(start, stop, 1_000):
        indexes = range(chunk, min(chunk + 1_000, stop))
        hashed = []
        for index in indexes:
            line = json.dumps({"type": "malware", "id": f"m{index}", "name": f"malware {index}"})
            hashed.append(hash_file(write_lines(file_path(connector.path, index), [line])))
        with connect(url) as conn, conn.transaction():
            ledger = Ledger(conn, connector.name)
            for file in hashed:
                unit = file_unit(connector.name, file)
                ledger.begin(file.key, unit.request, owner="bench/c")
                ledger.commit(file.key, {"commit_id": "bench", "files": [unit.source]}, owner="bench/c")
        keys = sorted(partition_key_for(connector, file.path) for file in hashed)
        instance.add_dynamic_partitions(name, keys)
        for key in keys:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=committed_key, partition=key))
    return time.perf_counter() - started


def tick_round(ticker: SensorTicker, instance: dg.DagsterInstance, connector: FileConnector, tag: str) -> tuple[float, float]:
    """One new file dropped: seconds of the first look and of the tick that requests its run. The
    file, its partition and the cursor are put back as they were, so every round sees N files."""
    assert connector.path is not None
    before = ticker.cursor
    new = write_lines(connector.path / "new" / f"{tag}.ndjson", [json.dumps({"type": "malware", "id": tag, "name": "new"})])
    look = timed(ticker.tick)
    started = time.perf_counter()
    result = ticker.tick()
    request = time.perf_counter() - started
    assert len(result.run_requests or []) == 1, f"the new file was not requested: {result.skip_reason}"
    new.unlink()
    instance.delete_dynamic_partition(partitions_for(connector).name or "", partition_key_for(connector, new))
    ticker.cursor = before
    return look, request


def page_round(api: GraphQL, key: dg.AssetKey) -> dict[str, float]:
    """Each of the asset page's queries once, in order: seconds per query."""
    one = {"path": list(key.path)}
    seconds: dict[str, float] = {}
    for name, query in PAGE_QUERIES.items():
        variables: dict[str, Any] = {"assetKeys": [one]} if "$assetKeys" in query else {"assetKey": one}
        started = time.perf_counter()
        api.query(query, variables)
        seconds[name] = time.perf_counter() - started
    return seconds


def backfill_round(api: GraphQL, connector: FileConnector, size: int) -> tuple[float, float]:
    """``launchPartitionBackfill`` over all partitions of the connector's assets: seconds until it
    answers with the created backfill, then seconds of the backfill page's statuses query
    (its targeted partitions per asset); then canceled (no daemon would run it anyway)."""
    params = {"backfillParams": {
        "assetSelection": [{"path": list(k.path)} for k in asset_keys(connector)], "allPartitions": True,
        "title": "partitions_bench",
    }}
    started = time.perf_counter()
    answer = api.query(LAUNCH_BACKFILL, params)["launchPartitionBackfill"]
    seconds = time.perf_counter() - started
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"launchPartitionBackfill answered {answer}")
    started = time.perf_counter()
    page = api.query(BACKFILL_PAGE, {"backfillId": answer["backfillId"]})["partitionBackfillOrError"]
    page_seconds = time.perf_counter() - started
    targeted = {s["numPartitionsTargeted"] for s in page["assetBackfillData"]["assetBackfillStatuses"]}
    if targeted != {size}:
        raise RuntimeError(f"the backfill targets {targeted} partitions per asset, not {size}")
    api.query(CANCEL_BACKFILL, {"backfillId": answer["backfillId"]})
    return seconds, page_seconds


def measure(
    size: int, ticker: SensorTicker, instance: dg.DagsterInstance, api: GraphQL, connector: FileConnector, repeat: int
) -> dict[str, Any]:
    """The row of one size: each figure the median of ``repeat`` rounds (all rounds kept)."""
    ticks = [tick_round(ticker, instance, connector, f"n{size}-r{r}") for r in range(repeat)]
    pages = [page_round(api, asset_keys(connector)[2]) for _ in range(repeat)]
    backfills = [backfill_round(api, connector, size) for _ in range(repeat)] if size else []
    return {
        "partitions": size,
        "tick_seconds": statistics.median(t[1] for t in ticks),
        "first_look_seconds": statistics.median(t[0] for t in ticks),
        "page_seconds": statistics.median(sum(p.values()) for p in pages),
        "page_queries": {name: statistics.median(p[name] for p in pages) for name in PAGE_QUERIES},
        "backfill_seconds": statistics.median(b[0] for b in backfills) if backfills else None,
        "backfill_page_seconds": statistics.median(b[1] for b in backfills) if backfills else None,
        "rounds": {"ticks": ticks, "pages": pages, "backfills": backfills},
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'partitions':>10}  {'tick s':>7}  {'1st look s':>10}  {'page s':>7}  {'backfill s':>10}  {'its page s':>10}"
          "  page queries (s)")
    for row in rows:
        backfill, its_page = (
            (f"{row[k]:.3f}" if row[k] is not None else "-") for k in ("backfill_seconds", "backfill_page_seconds")
        )
        queries = ", ".join(f"{name.removesuffix('Query')} {s:.3f}" for name, s in row["page_queries"].items())
        label = f"{row['partitions']:,}" + (" (fixed)" if row["partitions"] == 0 else "")
        print(f"{label:>10}  {row['tick_seconds']:7.3f}  {row['first_look_seconds']:10.3f}  {row['page_seconds']:7.3f}"
              f"  {backfill:>10}  {its_page:>10}  {queries}")


@contextmanager
def bench_setup(workdir: Path, server: str) -> Iterator[tuple[IdemConfig, str, dg.DagsterInstance, GraphQL]]:
    """The catalog, idem's database, the instance and a webserver on it (stopped on exit)."""
    url = fresh_database(server, DATABASE)
    with connect(url) as conn:
        ensure_schema(conn)
    home = instance_home(workdir, server)
    config_path = write_config(workdir)
    config = load_config(config_path)
    with dg.DagsterInstance.get() as instance, webserver(home, workdir, config_path, url) as api:
        yield config, url, instance, api


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=20_000, help="the largest size (default 20,000)")
    parser.add_argument("--sizes", help="comma-separated sizes (default 1000,5000,20000 up to --partitions, and it)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", help="server URL (default: the embedded pgserver)")
    parser.add_argument("--workdir", default=str(HERE / "data" / "partitions"))
    parser.add_argument("--out", help="write every figure as JSON here")
    args = parser.parse_args()
    exit_on_sigterm()
    sizes = sorted({int(s) for s in args.sizes.split(",")} if args.sizes else
                   {*(s for s in DEFAULT_SIZES if s < args.partitions), args.partitions})
    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    server = args.postgres or embedded_server(HERE / "data" / ".idem")  # outside the workdir emptied above
    facts = machine_facts()
    rows: list[dict[str, Any]] = []
    setup_seconds: dict[int, float] = {}
    with bench_setup(workdir, server) as (config, url, instance, api):
        connector = config.connector(CONNECTOR)
        assert isinstance(connector, FileConnector)
        ticker = SensorTicker(config, instance, url, sensor_name(connector))
        have = 0
        for size in [0, *sizes]:
            setup_seconds[size] = grow(instance, connector, url, have, size)
            have = size
            rows.append(measure(size, ticker, instance, api, connector, args.repeat))
            print(f"... {size:,} partitions measured (setup {setup_seconds[size]:.0f}s)", file=sys.stderr, flush=True)
        postgres = server_facts(url)
    print(f"machine: {facts['cpus']} CPUs, load {facts['load_average']}, cpu_speed {facts['cpu_speed_seconds']}s; "
          f"PostgreSQL {postgres['server_version']}; dagster {dg.__version__}; median of {args.repeat}")
    print_table(rows)
    result = {"machine": facts, "postgres": postgres, "dagster": dg.__version__, "setup_seconds": setup_seconds, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"} | {"rows": [
        {k: v for k, v in row.items() if k != "rounds"} for row in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
