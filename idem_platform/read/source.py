"""``idem_table``: a Spark Python data source reading ``idem.<record_type>`` in its current shape.

No JDBC jar: each input partition (a range of ``_idempotency_key``, see
:mod:`idem_platform.read.plan`) is read on an executor by psycopg and Arrow
(:mod:`idem_platform.read.decode`), and its old rows are upgraded there, in the
same pass (:mod:`idem_platform.read.upgrade`): the partition's batches leave
Python once, already in the current shape. Current rows cost no Python per row.

The plan travels as one pickled option (``plan``), like the records source's batch.
"""

from __future__ import annotations

import base64
import pickle
import threading
import weakref
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from idem_platform.read.plan import ReadPlan
from idem_platform.read.render import RENDERED_DDL, rendered_partition
from idem_platform.read.upgrade import KEEP, RAISE, SKIP, upgraded_partition

NAME = "idem_table"


def plan_option(plan: ReadPlan) -> str:
    """The ``plan`` option: the read plan, pickled."""
    return base64.b64encode(pickle.dumps(plan)).decode("ascii")


def spark_schema(plan: ReadPlan, *, render: bool = False) -> StructType:
    """The frame's Spark schema (``render``: ``idem read``'s lines, :data:`~idem_platform.read.render.RENDERED_DDL`)."""

    if render:
        rendered = StructType.fromDDL(RENDERED_DDL)
        assert isinstance(rendered, StructType)  # a list of columns parses to a struct (typed DataType)
        return rendered
    return from_arrow_schema(plan.arrow_schema())


class KeyRange(InputPartition):
    """One range of keys of the table (the plan's ``index``-th)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class TableReader(DataSourceReader):
    def __init__(self, plan: ReadPlan, mode: str, schema: StructType, *, render: bool = False) -> None:
        self.plan = plan
        self.mode = mode
        self.render = render
        self.schema = to_arrow_schema(schema, timezone="UTC")  # exactly what Spark checks batches against

    def partitions(self) -> Sequence[InputPartition]:
        return [KeyRange(i) for i in self.plan.indexes()] or [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KeyRange):
            return iter(())  # the table does not exist yet: no rows
        return self._read(partition.index)

    def _read(self, index: int) -> Iterator[pa.RecordBatch]:
        # Rendered in the same pass: no second trip through Python.
        batches = (rendered_partition if self.render else upgraded_partition)(self.plan, index, self.mode)
        for batch in batches:
            yield pa.RecordBatch.from_arrays(
                [column.cast(field.type) for column, field in zip(batch.columns, self.schema, strict=True)],
                schema=self.schema,
            )


class TableSource(DataSource):
    """Options: ``plan`` (:func:`plan_option`), ``mode`` (``raise`` | ``skip`` | ``keep``),
    ``render`` (``true``: ``idem read``'s JSON lines instead of the rows)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _plan(self) -> ReadPlan:
        plan = pickle.loads(base64.b64decode(self.options["plan"]))
        assert isinstance(plan, ReadPlan)
        return plan

    def _render(self) -> bool:
        return self.options.get("render", "false") == "true"

    def schema(self) -> StructType:
        return spark_schema(self._plan(), render=self._render())

    def reader(self, schema: StructType) -> DataSourceReader:
        mode = self.options.get("mode", RAISE)
        if mode not in (RAISE, SKIP, KEEP):
            raise ValueError(f"idem_table: mode {mode!r} is not raise, skip or keep")
        return TableReader(self._plan(), mode, schema, render=self._render())


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_lock = threading.Lock()


def register(spark: SparkSession) -> SparkSession:
    """Register ``idem_table`` on ``spark``, once per session."""
    with _lock:
        if spark not in _registered:
            spark.dataSource.register(TableSource)
            _registered.add(spark)
    return spark


def source_frame(spark: SparkSession, plan: ReadPlan, mode: str = RAISE, *, render: bool = False) -> DataFrame:
    """The lazy frame of ``plan`` (with the source's ``_migration_error`` column); ``render``:
    its rows as ``idem read``'s lines (:mod:`idem_platform.read.render`)."""
    return (
        register(spark).read.format(NAME)
        .schema(spark_schema(plan, render=render))
        .option("plan", plan_option(plan))
        .option("mode", mode)
        .option("render", "true" if render else "false")
        .load()
    )
