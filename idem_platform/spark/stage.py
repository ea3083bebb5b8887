"""Stage a planned commit on the executors, one Spark job per slice, results in slice order.

Each slice of the batch (a file's split, a run of Kafka offsets) is staged by
one task: it reads the slice's records, coerces them (the same functions as
the ``coerced`` frame) and COPYs the rows into the commit's staging tables
tagged with a fresh attempt id, then returns one message. A job's ``collect`` hands the driver exactly one message,
from the attempt Spark accepted; rows staged by failed, retried or speculative
attempts carry other attempt ids and are never applied or counted.

One job per slice (as many in flight as Spark has task slots) lets the driver
apply slice *k* while the executors stage the next ones: PostgreSQL's insert
work overlaps the executors' work instead of following it.

On a Spark Connect session (no RDD API) a job is ``spark.range(k, k+1)``
mapped in Arrow by the same task body, whose one output row is the pickled
message; ``collect`` again returns only the accepted attempt's row.

The tasks read their slices themselves, so no row crosses the JVM: a job is a
plain RDD job over one slice index (no Catalyst plan or codegen per slice; half
the driver JVM's CPU of a ``mapInArrow`` job here), while the per-record Python
inside the task works on Arrow batches from the slice's reader to the COPY.

Why not the Python data source writer (``DataSourceArrowWriter``): its planning
and commit run in fresh, non-daemon Python processes (SPARK-47346), about 8 s on
the first write of every run on this machine against ~1.5 s for a first plain
job, and its input rows cross the JVM: 44 s to stage 1M threat-feed records
through the writer, 20 s fused here. The guarantee is the same: only messages
that reached the driver are applied, in one transaction.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from idem_platform.coercion.records import DirectRows, RepeatedLines, coerce_batch
from idem_platform.errors import TransientError
from idem_platform.faults import checkpoint
from idem_platform.spark.slots import is_remote, task_slots
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import StagingWriter, new_attempt_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def stage_slice(indexes: Iterable[int], url: str, plan: CommitPlan) -> Iterator[tuple[StagedAttempt, float, int]]:
    """Task body: stage this task's slice under a fresh attempt id; yield its one message.

    The message is ``(what was staged, seconds, Spark's attempt number)``.
    """

    started = time.monotonic()
    attempt = new_attempt_id()
    context = TaskContext.get()
    attempt_number = context.attemptNumber() if context is not None else 0
    checkpoint("before_stage")
    (index,) = list(indexes)  # one slice per task, by construction of the job
    repeats = RepeatedLines()
    newest: dict[int, int] = {}
    records: dict[int, int] = {}
    writer = StagingWriter(url, plan, attempt)
    try:
        for chunk in plan.slices[index].read(plan.index_of, max_record_bytes=plan.spec.max_line_bytes):
            _note_newest(chunk, newest)
            count_records(chunk, plan.spec.lines, records)
            direct = DirectRows(list(plan.tables))  # ordinary records skip Arrow: straight to COPY rows
            writer.write(coerce_batch(chunk, plan.spec, repeats, direct), direct)
            checkpoint("staging", split=index, attempt=attempt_number)
    finally:
        writer.close()
    staged = StagedAttempt(
        partition=index,
        attempt=attempt,
        rows=writer.rows,
        with_extra=writer.with_extra,
        props_fields={rt: sorted(names) for rt, names in writer.props_fields.items()},
        rejected=writer.rejected,
        repeats=repeats.skipped,
        tombstones=repeats.tombstones,
        known=writer.known,
        unique_keys=repeats.unique,
        max_timestamps=newest,
        records=records,
    )
    yield staged, time.monotonic() - started, attempt_number


def _note_newest(records: pa.RecordBatch, newest: dict[int, int]) -> None:
    """Keep the newest source timestamp per unit (sources without timestamps cost one check)."""
    stamps = records.column("_timestamp")
    if stamps.null_count == len(stamps):
        return
    table = pa.table({"unit": records.column("_unit"), "stamp": stamps})
    for row in table.group_by("unit").aggregate([("stamp", "max")]).to_pylist():
        if row["stamp_max"] is not None:
            unit = int(row["unit"])
            newest[unit] = max(int(row["stamp_max"]), newest.get(unit, row["stamp_max"]))


def count_records(chunk: pa.RecordBatch, lines: bool, records: dict[int, int]) -> None:
    """Add the chunk's records per unit to ``records``: every raw record but, in a text
    file, its blank lines (empty or ASCII whitespace only: what ``bytes.isspace`` calls
    blank), which the coercion drops as no records. Each record counted here ends up
    exactly one of a staged row, a counted repeat, a known key or a reject, so a unit's
    skipped records are its records less its rows written and rejected."""
    units = chunk.column("_unit")
    if lines:
        raw = chunk.column("_raw").view(pa.string())  # bytes as they are: the checks below are byte-wise
        blank = pc.and_kleene(pc.is_valid(raw), pc.or_kleene(pc.equal(pc.binary_length(raw), 0), pc.ascii_is_space(raw)))
        units = pc.filter(units, pc.invert(pc.fill_null(blank, False)))
    for row in pa.table({"unit": units}).group_by("unit").aggregate([("unit", "count")]).to_pylist():
        unit = int(row["unit"])
        records[unit] = records.get(unit, 0) + int(row["unit_count"])


def stage_slice_arrow(batches: Iterator[pa.RecordBatch], url: str, plan: CommitPlan) -> Iterator[pa.RecordBatch]:
    """Task body of a Spark Connect job: the slice index arrives as the one row of
    ``spark.range``; the message leaves pickled, as the one row of the output."""
    indexes = [int(i) for batch in batches for i in batch.column(0).to_pylist()]
    for message in stage_slice(iter(indexes), url, plan):
        yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(message)], pa.binary())], names=["message"])


class StagingJobs:
    """The staging jobs of one commit, submitted from a thread pool, cancelled together.

    Use as a context manager; iterate :meth:`in_order` to get each slice's
    accepted message as soon as it and every earlier slice is staged.
    """

    def __init__(self, spark: SparkSession | None, url: str, plan: CommitPlan) -> None:
        self.spark = spark
        self.url = url
        self.plan = plan
        self.group = f"idem-stage-{plan.commit_id}"
        self.task_seconds: dict[int, float] = {}
        self.attempt_numbers: dict[int, int] = {}
        # A batch with nothing to read (empty files) stages nothing and needs no session.
        slots = task_slots(spark) if spark is not None else 1
        self.remote = spark is not None and is_remote(spark)
        self.pool = ThreadPoolExecutor(max_workers=min(slots, max(1, len(plan.slices))), thread_name_prefix="idem-stage")
        self.futures: list[Future[StagedAttempt]] = []

    def __enter__(self) -> StagingJobs:
        self.futures = [self.pool.submit(self._run, index) for index in range(len(self.plan.slices))]
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            for future in self.futures:
                future.cancel()
            if self.spark is not None:
                try:
                    if self.remote:
                        self.spark.interruptTag(self.group)
                    else:
                        self.spark.sparkContext.cancelJobGroup(self.group)
                except Exception:  # noqa: BLE001 - a dead server has no jobs left to cancel; the first error stands
                    pass
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, index: int) -> StagedAttempt:
        if self.spark is None:
            raise TransientError(f"slice {index} of commit {self.plan.commit_id} has records but no Spark session")
        if self.remote:
            return self._run_remote(index)
        context = self.spark.sparkContext
        context.setJobGroup(self.group, f"idem: stage slice {index} of commit {self.plan.commit_id}", True)
        url, plan = self.url, self.plan

        def body(indexes: Iterable[int]) -> Iterator[tuple[StagedAttempt, float, int]]:
            return stage_slice(indexes, url, plan)

        # A plain RDD job: no Catalyst plan or codegen per slice, and collect()
        # returns the message of the one attempt Spark accepted.
        ((staged, seconds, attempt_number),) = context.parallelize([index], 1).mapPartitions(body).collect()
        self.task_seconds[index] = seconds
        self.attempt_numbers[index] = attempt_number
        return staged

    def _run_remote(self, index: int) -> StagedAttempt:
        """The slice's job on a Spark Connect session (tagged per thread, interrupted together)."""
        spark = self.spark
        assert spark is not None
        spark.addTag(self.group)
        url, plan = self.url, self.plan

        def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return stage_slice_arrow(batches, url, plan)

        try:
            ((payload,),) = spark.range(index, index + 1, 1, 1).mapInArrow(body, "message binary").collect()
        except Exception as exc:
            # Late import: the executors' Python workers import this module, and the Connect
            # client's retry policy pulls in pandas through pyspark.testing (~0.4 s a worker).
            from idem_platform.spark.remote import lost_server

            reason = lost_server(exc)
            if reason is None:
                raise
            # One line (gRPC's own message spans many), and not retried at length: see bound_retries.
            raise TransientError(f"the Spark Connect server stopped answering ({reason})") from exc
        finally:
            spark.removeTag(self.group)
        staged, seconds, attempt_number = pickle.loads(payload)
        self.task_seconds[index] = seconds
        self.attempt_numbers[index] = attempt_number
        return staged

    def in_order(self) -> Iterator[StagedAttempt]:
        """Accepted messages, slice 0 first (raises the first failure)."""
        for future in self.futures:
            yield future.result()
