"""The quarantine loop: a connector's rejects through the current catalog, committed once they pass.

:func:`retry_rejects` is what ``idem rejects retry`` and the ``<connector>_retry_rejects``
Dagster job run. The rejects are planned as a source
(:mod:`idem_platform.sources.rejects`) and go through the one write path: Spark
tasks read them back and coerce them with the same code as a first ingest (their
keys are the keys they would have had), staging, one applying transaction that
writes the rows, marks the rejects retried, hands those that still fail back to
the quarantine with their new reasons, and records the ``commits`` row, the
execution log and the ledger. Nothing is ever deleted from ``idem.rejects``.

Run twice, the second run selects nothing (what passed is marked) or, when every
reject still fails against an unchanged catalog, finds that very retry committed
in the ledger and tries nothing: it writes nothing and says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from idem_platform.coercion.records import coerce_batch
from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.pipeline.commit import CommitRequest, commit_batch
from idem_platform.pipeline.ingest import (
    CoercedBatch,
    current_tables,
    prepare_tables,
    read_ledger,
    record_spec,
)
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.sources.rejects.plan import RetryPlan, plan_retry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NOT_RETRYABLE = {
    "truncated": "raw text cut at the record limit: the record is not all there",
    "unplaceable": "position does not end with its line: the original position cannot be rebuilt",
    "blank": "blank line: not a record",
}
RESULT_KEYS = (
    "tables", "schema_versions", "sources", "timings", "already_committed", "prior", "effects_created", "effects_suppressed",
)


def retry_rejects(
    url: str,
    config: IdemConfig,
    connector: ConnectorConfig,
    spark: Callable[[], SparkSession],
    *,
    commit_id: str | None = None,
    dry_run: bool = False,
    run_id: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Retry ``connector``'s quarantined rejects (of ``commit_id`` only, if given); return the summary.

    Args:
        url: PostgreSQL.
        config: the current idem.yaml: its catalog is what the rejects are coerced to.
        connector: whose rejects, with its current rules (key namespace, id field,
            ``missing_id``: the keys are the ones a first ingest gives).
        spark: gives the session; called only when there is something to retry.
        commit_id: only the rejects of this commit (for a retry's commit: those it left quarantined).
        dry_run: count how many would pass now, in Spark, and commit nothing (no DDL either).
        run_id: the Dagster run, recorded in ``idem.commits``.
        progress: told what the run does, a line at a time.

    Raises:
        ConfigError: the catalog cannot be applied (a column's type changed).
        TransientError, TerminalError: the commit failed; nothing was committed.
    """
    started = time.monotonic()
    say = progress or (lambda _message: None)
    if not dry_run:
        prepare_tables(url, config, connector)  # the fixed catalog: new tables and columns
    tables = current_tables(url, config, connector)
    # Rejects are quarantined already: a retry whose rejects still fail is no reason to fail it.
    retrying = connector.model_copy(update={"max_reject_ratio": 1.0})
    plan = plan_retry(url, retrying, record_spec(retrying, tables, ()), commit_id=commit_id)
    barred = sum(info["count"] for info in plan.barred.values())
    say(
        f"{plan.selected:,} quarantined rejects of {connector.name} to retry"
        + (f" (commit {commit_id})" if commit_id else "")
        + f" from {len(plan.batch.pending)} source(s) in {len(plan.batch.slices)} slice(s)"
        + (f"; {barred:,} cannot be retried" if barred else "")
        + (f"; {plan.already_retried:,} retried earlier" if plan.already_retried else "")
    )
    summary = _Summary(connector, plan, commit_id, dry_run, started)
    if not plan.selected:
        if plan.unchanged:
            return summary.nothing(
                f"the {plan.unchanged:,} quarantined rejects were retried against this same catalog by "
                f"{', '.join(plan.tried_by)} and still fail; change idem.yaml first"
            )
        scope = f"commit {commit_id}" if commit_id else connector.name
        return summary.nothing(f"no quarantined rejects of {scope} can be retried")
    assert plan.key is not None
    prior = read_ledger(url, connector.name, [plan.key]).get(plan.key)
    if prior is not None and prior.status == "committed":  # a twin retry committed since we planned
        tried_by = (prior.result or {}).get("commit_id")
        return summary.nothing(f"a retry of these same rejects committed meanwhile (commit {tried_by}); nothing new was tried")
    coerced = CoercedBatch(plan.batch, retrying, tables)
    if dry_run:
        passing, failing = dry_run_counts(spark(), coerced)
        say(f"dry run: {passing:,} would pass, {failing:,} would still fail; nothing was committed")
        return summary.done({}, would_pass=passing, would_fail=failing)
    request = CommitRequest(url=url, connector=retrying, run_id=run_id, progress=progress)
    result = commit_batch(request, coerced, spark, started=started)
    if not result.get("commit_id"):  # another retry took these rejects first
        return summary.nothing(str(result.get("already_committed") or "nothing was committed"), result=result)
    if result.get("replayed"):  # a twin retry of the same rejects committed while this one waited
        tried_by = (result.get("prior") or {}).get("commit_id")
        return summary.nothing(
            f"a retry of these same rejects committed meanwhile (commit {tried_by}); nothing new was tried",
            result=result,
        )
    still = int(result.get("rows_rejected") or 0)
    say(f"{plan.selected - still:,} rejects now pass and are committed; {still:,} still fail and stay quarantined")
    return summary.done(result, passed=plan.selected - still, still_failing=still)


def dry_run_counts(spark: SparkSession, coerced: CoercedBatch) -> tuple[int, int]:
    """``(would pass, would still fail)``: each slice read and coerced by a Spark task, counted.

    A ``mapInArrow`` over one row per slice: the task reads its slice's rejects and runs
    the coercion the commit runs (:func:`~idem_platform.coercion.records.coerce_batch`,
    same spec), and returns two numbers. No row crosses the JVM and nothing is staged.
    """

    batch = coerced.batch
    if not batch.slices:
        return 0, 0
    spec = dataclasses.replace(coerced.spec(), dynamic_values=False)
    slices, index_of, limit = batch.slices, batch.index_of(), coerced.connector.max_line_bytes

    def count(batches: Any) -> Any:
        for ids in batches:
            for index in ids.column(0).to_pylist():
                passing = failing = 0
                for records in slices[index].read(index_of, max_record_bytes=limit):
                    errors = coerce_batch(records, spec).column("_errors")
                    failing += len(errors) - errors.null_count
                    passing += errors.null_count
                yield pa.RecordBatch.from_pydict({"passing": [passing], "failing": [failing]})

    frame = spark.range(len(slices), numPartitions=len(slices)).mapInArrow(count, "passing long, failing long")
    totals = frame.groupBy().sum("passing", "failing").collect()[0]
    return int(totals[0] or 0), int(totals[1] or 0)


class _Summary:
    """The summary's shape: the commit summary's contract keys, then ``retry``."""

    def __init__(self, connector: ConnectorConfig, plan: RetryPlan, commit_id: str | None, dry_run: bool, started: float) -> None:
        self.connector = connector
        self.plan = plan
        self.commit_id = commit_id
        self.dry_run = dry_run
        self.started = started

    def _base(self, result: dict[str, Any], retry: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "commit_id": result.get("commit_id") if not result.get("replayed") else None,
            "rows_written": int(result.get("rows_written") or 0) if not result.get("replayed") else 0,
            "rows_skipped": int(result.get("rows_skipped") or 0) if not result.get("replayed") else 0,
            "rows_rejected": int(result.get("rows_rejected") or 0) if not result.get("replayed") else 0,
            "replayed": bool(result.get("replayed")),
            "files": [],
            "seconds": round(time.monotonic() - self.started, 3),
            "connector": self.connector.name,
        }
        out["retry"] = {
            "commit": self.commit_id,
            "dry_run": self.dry_run,
            "selected": self.plan.selected,
            **retry,
            "already_retried": self.plan.already_retried,
            "unchanged": self.plan.unchanged,
            **({"tried_by": list(self.plan.tried_by)} if self.plan.tried_by else {}),
            "not_retryable": self.plan.barred,
        }
        for key in RESULT_KEYS:
            if result.get(key):
                out[key] = result[key]
        return out

    def nothing(self, message: str, *, result: dict[str, Any] | None = None, **details: Any) -> dict[str, Any]:
        out = self._base(result or {}, {"passed": 0, "still_failing": 0, **details, "message": message})
        out["retry"]["selected"] = 0
        out["nothing_to_retry"] = True
        return out

    def done(self, result: dict[str, Any], **counts: Any) -> dict[str, Any]:
        return self._base(result, counts)


def human_retry_summary(summary: dict[str, Any]) -> str:
    """A retry's summary for a person at a terminal."""
    retry = summary["retry"]
    seconds = float(summary.get("seconds") or 0)
    scope = summary.get("connector") or "?"
    if retry.get("commit"):
        scope += f" (commit {retry['commit']})"
    lines: list[str] = []
    if summary.get("nothing_to_retry"):
        lines.append(f"nothing retried: {retry.get('message')} ({seconds:.1f} s)")
    elif retry.get("dry_run"):
        lines.append(
            f"dry run: {retry['selected']:,} rejects of {scope} would be retried against the current catalog: "
            f"{retry.get('would_pass', 0):,} would pass, {retry.get('would_fail', 0):,} would still fail; "
            f"nothing was committed ({seconds:.1f} s)"
        )
    else:
        commit_id = summary.get("commit_id")
        lines.append(f"retried {retry['selected']:,} rejects of {scope}: committed {commit_id} in {seconds:.1f} s")
        lines.append(
            f"  {retry.get('passed', 0):,} now pass: {summary.get('rows_written', 0):,} written, "
            f"{summary.get('rows_skipped', 0):,} skipped (their keys were committed already)"
        )
        for record_type, counts in sorted((summary.get("tables") or {}).items()):
            lines.append(f"    {qualified_table_name(record_type)}: {counts.get('written', 0):,} written, {counts.get('skipped', 0):,} skipped")
        if retry.get("still_failing"):
            lines.append(
                f"  {retry['still_failing']:,} still fail and stay quarantined with their new reasons: "
                f"idem rejects --commit {commit_id}"
            )
    for reason, info in sorted((retry.get("not_retryable") or {}).items()):
        shown = ", ".join(info.get("positions") or [])
        more = "…" if info["count"] > len(info.get("positions") or []) else ""
        lines.append(f"  {info['count']:,} cannot be retried ({NOT_RETRYABLE.get(reason, reason)}): {shown}{more}")
    if retry.get("unchanged") and not summary.get("nothing_to_retry"):
        lines.append(
            f"  {retry['unchanged']:,} left alone: tried against this same catalog by "
            f"{', '.join(retry.get('tried_by') or [])} and failed"
        )
    if retry.get("already_retried"):
        lines.append(f"  {retry['already_retried']:,} were retried and committed by earlier runs")
    return "\n".join(lines)
