"""Asset checks next to their assets: pandera on ``coerced``, commit consistency and reject ratio on ``committed``."""


import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg
import pandas as pd
import pandera.pandas as pa
import psycopg
import pyarrow
import pyarrow.compute as pc
from dagster import PreviewWarning
from pandera.errors import SchemaErrors

from idem_platform.config import ConnectorConfig
from idem_platform.contract.catalog import TableSpec
from idem_platform.defs.resources import DEFAULT_KEYS, PostgresResource, ResourceKeys
from idem_platform.defs.summary import (
    REJECT_SAMPLE,
    reject_ratio,
    reject_sample,
    summary_from_metadata,
)
from idem_platform.pipeline.ingest import CoercedBatch
from idem_platform.postgres.tables import table_ident
from idem_platform.sources.filedrop.figures import (
    position_prefix,
    reject_samples,
    rejected_by_file,
    written_by_file,
)
from idem_platform.sources.rejects.listing import list_rejects
from idem_platform.sources.sample import coerced_sample

if TYPE_CHECKING:
    import pandas as pd
    import pandera.pandas as pa

SAMPLE_ROWS = 2000
KEY_PATTERN = r"^[a-z0-9_-]{1,64}:[a-z0-9_-]{1,64}:.+:[0-9a-f]{12}$"
_SYSTEM_CHECKED = ("_idempotency_key", "_content_hash", "_payload")


def pandera_schema(spec: TableSpec, *, spark: bool = True) -> "pa.DataFrameSchema":
    """The data contract of one record type's coerced rows (system columns + typed columns).

    Every column's dtype is the Arrow type coercion makes for its catalog type
    (``pd.ArrowDtype``, see :func:`contract_frame`), checked as it is and never coerced:
    a nullable ``long`` column through pandas' float64 turned 2**63-1 into 2**63, which
    no longer fit Int64, so a valid file failed the blocking check forever. With Arrow
    dtypes the check can only fail on what the contract forbids: a wrong type, a null
    in a required column, a key or hash of the wrong form, a vector of the wrong length.
    ``spark`` picks the types the commit path carries (``spark_arrow``: microsecond
    timestamps, variable lists); ``False`` the catalog's own (``arrow``).

    pandera is imported here, not at module load: it takes a second to import and
    only this check needs it. Arrow-backed text is also checked by its dtype, not value
    by value (an ``object`` column cost ~1 ms a column even when every value passes).
    """

    text = pd.ArrowDtype(pyarrow.string())
    columns: dict[str, pa.Column] = {
        # Not unique: a key repeated in the batch is legitimate (it is skipped at commit).
        "_idempotency_key": pa.Column(text, pa.Check.str_matches(KEY_PATTERN)),
        "_content_hash": pa.Column(text, pa.Check.str_matches(r"^[0-9a-f]{40}$")),
        "_payload": pa.Column(text, nullable=False),
    }
    for column in spec.columns:
        checks = []
        if column.type.kind == "vector":
            dim = column.type.dim
            checks.append(pa.Check(lambda s, dim=dim: s.dropna().list.len() == dim, name=f"length_{dim}"))
        arrow = column.type.spark_arrow if spark else column.type.arrow
        columns[column.name] = pa.Column(pd.ArrowDtype(arrow), checks=checks, nullable=not column.required)
    return pa.DataFrameSchema(columns, strict=False)


def contract_frame(rows: pyarrow.Table, record_type: str, spec: TableSpec) -> "pd.DataFrame":
    """One record type's coerced rows as the frame :func:`pandera_schema` validates: the
    system columns it checks and the typed columns, converted in one ``to_pandas``.

    Every column keeps its Arrow type (``pd.ArrowDtype``): no float64 for a nullable
    integer column, no nanosecond ``datetime64`` for a timestamp, so every value of
    every catalog type's range reaches pandera as it was coerced.
    """

    typed = rows.column(record_type).combine_chunks().flatten()
    table = pyarrow.Table.from_arrays(
        [rows.column(name) for name in _SYSTEM_CHECKED] + list(typed),
        names=[*_SYSTEM_CHECKED, *(column.name for column in spec.columns)],
    )
    return table.to_pandas(types_mapper=pd.ArrowDtype)


def build_checks(
    connector: ConnectorConfig,
    coerced_key: dg.AssetKey,
    committed_key: dg.AssetKey,
    partitions: dg.PartitionsDefinition | None = None,
    resource_keys: ResourceKeys = DEFAULT_KEYS,
) -> list[dg.AssetChecksDefinition]:
    """The connector's asset checks, partitioned like its assets: each dropped file has its
    own results, and one file's warning is never replaced by the next file's pass.

    Dagster 1.13 marks partitioned checks as a preview (a ``PreviewWarning`` at
    definition); the warning is silenced here, where the choice was made.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=PreviewWarning)
        return _build_checks(connector, coerced_key, committed_key, partitions, resource_keys)


def _build_checks(
    connector: ConnectorConfig,
    coerced_key: dg.AssetKey,
    committed_key: dg.AssetKey,
    partitions: dg.PartitionsDefinition | None,
    resource_keys: ResourceKeys,
) -> list[dg.AssetChecksDefinition]:
    """One builder per check, so each reads on its own; the list keeps the order Dagster has always shown."""
    return [
        _pandera_contract_check(coerced_key, partitions),
        _commit_consistency_check(committed_key, partitions, resource_keys),
        _reject_ratio_check(connector, committed_key, partitions, resource_keys),
    ]


def _pandera_contract_check(
    coerced_key: dg.AssetKey, partitions: dg.PartitionsDefinition | None
) -> dg.AssetChecksDefinition:
    """``pandera_contract`` on ``coerced``: the blocking check that stops a commit whose rows
    break the catalog's contract, decided on a bounded sample so it never waits for Spark."""

    @dg.asset_check(
        asset=coerced_key,
        partitions_def=partitions,
        name="pandera_contract",
        blocking=True,
        description=(
            f"Validates a sample (the first {SAMPLE_ROWS} lines, coerced by the same code as the "
            "commit) of the coerced frame against a pandera schema built from the catalog: key "
            "format, content hashes, types, required columns, vector lengths. Blocking: a failure "
            "stops the commit. The sample is bounded, so it is computed without waiting for Spark."
        ),
    )
    def pandera_contract(context: dg.AssetCheckExecutionContext, coerced: CoercedBatch) -> dg.AssetCheckResult:
        if coerced.batch.fully_replayed:
            return dg.AssetCheckResult(passed=True, metadata={"skipped": "everything already committed"})
        started = time.monotonic()
        record_spec = coerced.spec()
        sample = coerced_sample(coerced.batch, record_spec, SAMPLE_ROWS)
        context.log.debug("pandera sample: %d rows in %.2fs", sample.num_rows, time.monotonic() - started)
        failures: dict[str, Any] = {}
        checked: dict[str, int] = {}
        for record_type, spec in sorted(coerced.tables.items()):
            rows = sample.filter(pc.equal(sample.column("_record_type"), record_type))
            if rows.num_rows == 0:
                continue
            frame = contract_frame(rows, record_type, spec)
            checked[record_type] = rows.num_rows

            try:
                pandera_schema(spec, spark=record_spec.spark_types).validate(frame, lazy=True)
            except SchemaErrors as exc:
                failures[record_type] = exc.failure_cases.head(10).astype(str).to_dict("records")
        return dg.AssetCheckResult(
            passed=not failures,
            metadata={"rows_checked": dg.MetadataValue.json(checked), "failures": dg.MetadataValue.json(failures)},
        )

    return pandera_contract


CheckOutcome = tuple[bool, dict[str, Any]]  # passed, metadata


def _partition_check(
    committed_key: dg.AssetKey,
    partitions: dg.PartitionsDefinition | None,
    name: str,
    description: str,
    severity: dg.AssetCheckSeverity,
    judge: Callable[[PostgresResource, dict[str, Any] | None], CheckOutcome],
    resource_keys: ResourceKeys,
) -> dg.AssetChecksDefinition:
    """A check on ``committed`` evaluated for each partition the run covered.

    A run over one partition returns an ``AssetCheckResult``, which Dagster records
    under that partition. A run over many (the sensor's batch, a single-run backfill)
    yields an ``AssetCheckEvaluation`` per partition with ``partition=`` set: in
    Dagster 1.13 an ``AssetCheckResult`` takes no partition, and one returned from a
    multi-partition step is recorded without a partition
    (``AssetCheckResult.to_asset_check_evaluation`` sets ``partition`` only when
    ``step_context.has_partition_key``), which left every file's check SKIPPED. The
    check is a one-spec ``multi_asset_check`` with ``can_subset``: its output is
    optional, so it may report through the evaluations alone.
    """
    spec = dg.AssetCheckSpec(name, asset=committed_key, partitions_def=partitions, description=description)

    @dg.multi_asset_check(
        specs=[spec], can_subset=True, name=f"{committed_key.to_python_identifier()}_{name}", description=description,
        required_resource_keys={resource_keys.postgres},
    )
    def partition_check(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult | dg.AssetCheckEvaluation]:
        postgres = resource_keys.postgres_of(context)
        if context.has_partition_key or not context.has_partition_key_range:
            passed, metadata = judge(postgres, _latest_summary(context, committed_key))
            yield dg.AssetCheckResult(passed=passed, severity=severity, metadata=metadata)
            return
        for partition in context.partition_keys:
            passed, metadata = judge(postgres, _latest_summary(context, committed_key, partition))
            yield dg.AssetCheckEvaluation(
                asset_key=committed_key, check_name=name, passed=passed, metadata=metadata,
                severity=severity, partition=partition,
            )

    return partition_check


def _commit_consistency_check(
    committed_key: dg.AssetKey, partitions: dg.PartitionsDefinition | None, resource_keys: ResourceKeys
) -> dg.AssetChecksDefinition:
    """``commit_consistency`` on ``committed``: proof from PostgreSQL itself that the partition's
    last commit is whole (the rows and rejects it claims are there, keys are unique)."""
    return _partition_check(
        committed_key, partitions, "commit_consistency",
        "The partition's latest commit is whole: each table holds exactly the rows the commit "
        "says it wrote (for a file of a batch: the rows of that file), no key twice, and its "
        "rejects are recorded.",
        dg.AssetCheckSeverity.ERROR,
        _judge_consistency,
        resource_keys,
    )


def _judge_consistency(postgres: PostgresResource, summary: dict[str, Any] | None) -> CheckOutcome:
    """Compare what a ``committed`` materialization says with what PostgreSQL holds."""
    if summary is None:
        return False, {"error": "no materialization with a summary"}
    if summary.get("replayed"):
        return True, {"replay_of": dg.MetadataValue.json(summary.get("prior") or {})}
    problems: list[str] = []
    file_key = summary.get("file_key")
    with postgres.connection() as conn:
        tables = summary.get("tables") or {}
        found = _rows_found(conn, summary["commit_id"], list(tables), file_key)
        for record_type, counts in tables.items():
            if found.get(record_type, 0) != counts["written"]:
                problems.append(f"{record_type}: commit says {counts['written']}, table holds {found.get(record_type, 0)}")
            if not _unique_key_index(conn, record_type):
                problems.append(f"{record_type}: no unique index on _idempotency_key")
        rejects = rejected_by_file(conn, summary["commit_id"])
        held = rejects.get(file_key, 0) if file_key else sum(rejects.values())
        if held != summary["rows_rejected"]:
            problems.append(f"rejects: commit says {summary['rows_rejected']}, table holds {held}")
    return not problems, {"rows_found": dg.MetadataValue.json(found), "problems": dg.MetadataValue.json(problems)}


def _rows_found(conn: psycopg.Connection, commit_id: str, record_types: list[str], file_key: str | None) -> dict[str, int]:
    """Rows each table holds of the commit (of one file's records when ``file_key`` is given)."""
    if file_key:
        return written_by_file(conn, commit_id, record_types, [file_key]).get(position_prefix(file_key), {})
    found = {}
    for record_type in record_types:
        table = table_ident(record_type).as_string(conn)
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE _commit_id = %s", [commit_id]).fetchone()
        found[record_type] = int(row[0]) if row else 0
    return found


def _unique_key_index(conn: psycopg.Connection, record_type: str) -> bool:
    """"No key twice" is PostgreSQL's to enforce: the unique index is there (rather than
    sorting every key of the commit again)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND i.indisunique "
        "AND i.indnatts = 1 AND a.attname = '_idempotency_key')",
        [table_ident(record_type).as_string(conn)],
    ).fetchone()
    return bool(row and row[0])


def _reject_ratio_check(
    connector: ConnectorConfig,
    committed_key: dg.AssetKey,
    partitions: dg.PartitionsDefinition | None,
    resource_keys: ResourceKeys,
) -> dg.AssetChecksDefinition:
    """``reject_ratio`` on ``committed``: a warning (never a failure) when a commit rejected more
    than 1% of its records, with a sample of the rejects so the cause is one click away."""
    return _partition_check(
        committed_key, partitions, "reject_ratio",
        "Warns when the partition's last commit rejected more than 1% of its records (for a file "
        f"of a batch: of that file's lines); the batch fails outright above max_reject_ratio={connector.max_reject_ratio}.",
        dg.AssetCheckSeverity.WARN,
        _judge_reject_ratio,
        resource_keys,
    )


def _judge_reject_ratio(postgres: PostgresResource, found: dict[str, Any] | None) -> CheckOutcome:
    """The partition's reject ratio (a replay's: the prior commit's) and a sample of its rejects."""
    summary = found or {}
    if summary.get("replayed") and isinstance(summary.get("prior"), dict):
        # A replay wrote and rejected nothing; the partition's data is the prior commit's.
        summary = {**summary, **summary["prior"], "commit_id": summary["prior"].get("commit_id")}
    total = sum(int(summary.get(k) or 0) for k in ("rows_written", "rows_skipped", "rows_rejected"))
    ratio = reject_ratio(summary)
    metadata: dict[str, Any] = {"reject_ratio": dg.MetadataValue.float(ratio), "records": dg.MetadataValue.int(total)}
    if summary.get("commit_id") and summary.get("rows_rejected"):
        with postgres.connection() as conn:
            file_key = summary.get("file_key")
            if file_key:
                sample = reject_samples(conn, summary["commit_id"], [file_key], REJECT_SAMPLE).get(file_key, [])
            else:
                rejects = list_rejects(conn, commit_id=summary["commit_id"], limit=REJECT_SAMPLE)
                sample = [(r["position"], list(r["reasons"])) for r in rejects]
        metadata["rejects"] = reject_sample(sample)
    return ratio <= 0.01, metadata


def _latest_summary(
    context: dg.AssetCheckExecutionContext, key: dg.AssetKey, partition: str | None = None
) -> dict[str, Any] | None:
    """The commit summary of the checked partition's latest materialization: the checks judge
    what the commit recorded, read back from Dagster rather than passed between steps."""
    if partition is None and context.has_partition_key:
        partition = context.partition_key
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return summary_from_metadata(records[0].asset_materialization.metadata)
