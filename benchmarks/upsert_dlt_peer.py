"""The dlt contender of ``upsert_bench.py``: run in the peers' venv (where dlt lives), never the project's.

    python upsert_dlt_peer.py --uri URL --dataset NAME [--base] FILE...

Each file is one pipeline run (extract, normalize, load), as files arrive, with
``write_disposition={"disposition": "merge", "strategy": "upsert"}``, ``primary_key="id"``,
a ``dedup_sort`` hint on ``version`` and a ``hard_delete`` hint on the bool column
``deleted`` (``op == "d"``: dlt deletes on a hard_delete column that is not null, or true
for a bool, so the string ``op`` itself cannot carry the hint). dlt's upsert merges the
staging table with one ``MERGE`` and does not deduplicate it (``dedup_sort`` applies to
``delete-insert`` only), and PostgreSQL's ``MERGE`` refuses to touch a row twice, so each
file is reduced to its greatest version per id first, inside the timing: what a user of
this strategy must do. Across files, dlt is last write wins by load order.

``--base``: one run of all the files with ``write_disposition="replace"`` (a first full
load, the fast path for the daily-delta case's starting table). Prints one JSON line:
``{"wall_s": ..., "runs": ...}``.
"""

import os

os.environ["RUNTIME__DLTHUB_TELEMETRY"] = "false"
os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
WORKDIR = os.environ.get("IDEM_PEER_BENCH_HOME", "/tmp/idem-peer-bench")
os.environ.setdefault("DLT_DATA_DIR", os.path.join(WORKDIR, ".dlt_pipelines", "_data"))
os.environ.setdefault("DLT_PROJECT_DIR", WORKDIR)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.json as pj  # noqa: E402

PIPES_DIR = os.path.join(WORKDIR, ".dlt_pipelines")


def read_file(path: str, latest_only: bool) -> pa.Table:
    """One NDJSON file as Arrow, with ``deleted`` (op == "d"); if ``latest_only``, its greatest version per id."""
    table = pj.read_json(path)
    table = table.append_column("deleted", pc.equal(table.column("op"), "d"))
    if not latest_only:
        return table
    table = table.sort_by([("id", "ascending"), ("version", "descending")])
    ids = table.column("id").combine_chunks()
    keep = pc.not_equal(ids[1:], ids[:-1]) if len(ids) > 1 else pa.array([], pa.bool_())
    mask = pa.concat_arrays([pa.array([True]), keep.fill_null(True)]) if len(ids) else pa.array([], pa.bool_())
    return table.filter(mask)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--base", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the dataset and pipeline state (a later run continues)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    import dlt
    import psycopg

    name = f"upsert_{args.dataset}"
    if not args.keep:
        with psycopg.connect(args.uri, autocommit=True) as conn:
            for schema in (args.dataset, args.dataset + "_staging"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        shutil.rmtree(os.path.join(PIPES_DIR, name), ignore_errors=True)
    dest = dlt.destinations.postgres(credentials=args.uri.replace("bench@", "bench:bench@", 1))
    pipeline = dlt.pipeline(pipeline_name=name, destination=dest, dataset_name=args.dataset, pipelines_dir=PIPES_DIR, progress=None)
    columns = {"version": {"data_type": "bigint", "dedup_sort": "desc"}, "deleted": {"data_type": "bool", "hard_delete": True}}
    started = time.perf_counter()
    if args.base:
        tables = [read_file(path, latest_only=False) for path in args.files]
        resource = dlt.resource(tables, name="events", write_disposition="replace", primary_key="id", columns=columns)
        pipeline.run(resource, loader_file_format="csv")
        runs = 1
    else:
        disposition = {"disposition": "merge", "strategy": "upsert"}
        for path in args.files:
            resource = dlt.resource([read_file(path, latest_only=True)], name="events", write_disposition=disposition,
                                    primary_key="id", columns=columns)
            pipeline.run(resource, loader_file_format="csv")
        runs = len(args.files)
    print(json.dumps({"wall_s": round(time.perf_counter() - started, 3), "runs": runs, "dlt": dlt.__version__}), flush=True)


if __name__ == "__main__":
    main()
