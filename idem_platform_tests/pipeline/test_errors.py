"""Failures read the same wherever they happen: on the driver or inside a Spark executor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from idem_platform import errors
from idem_platform.pipeline.commit import as_idem_error


@pytest.fixture(params=["rdd", "arrow"])
def job_kind(request: pytest.FixtureRequest) -> str:
    """Staging runs plain RDD jobs; the lazy frames run Arrow jobs: errors must read alike."""
    return str(request.param)


def _fail_job(spark: Any, body: Any, kind: str) -> BaseException:
    """Run ``body`` in an executor's Python worker and return what the driver caught."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        body()
        yield from batches

    with pytest.raises(Exception) as caught:
        if kind == "rdd":
            spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()
        else:
            spark.range(0, 1, 1, numPartitions=1).mapInArrow(task, "id long").toArrow()
    return caught.value


def test_postgres_lost_by_an_executor_reads_like_postgres_lost_by_the_driver(spark: Any, pg_url: str, job_kind: str) -> None:
    def lose_connection() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    in_executor = as_idem_error(_fail_job(spark, lose_connection, job_kind))
    with pytest.raises(psycopg.Error) as on_driver:
        lose_connection()
    driver_error = as_idem_error(on_driver.value)

    assert isinstance(in_executor, errors.TransientError)
    assert str(in_executor).startswith("PostgreSQL: "), str(in_executor)
    assert str(driver_error).startswith("PostgreSQL: "), str(driver_error)
    assert str(in_executor).split(":")[1] == str(driver_error).split(":")[1]  # the same psycopg class


def test_an_idem_error_raised_in_an_executor_keeps_its_class(spark: Any, job_kind: str) -> None:
    def changed() -> None:
        raise errors.FileChangedError("drop/a.ndjson changed while it was read")

    error = as_idem_error(_fail_job(spark, changed, job_kind))
    assert type(error) is errors.FileChangedError
    assert str(error) == "drop/a.ndjson changed while it was read"


def test_any_other_executor_failure_is_a_transient_spark_error(spark: Any, job_kind: str) -> None:
    def boom() -> None:
        raise KeyError("no such split")

    error = as_idem_error(_fail_job(spark, boom, job_kind))
    assert isinstance(error, errors.TransientError)
    assert str(error).startswith("Spark job failed: "), str(error)
    assert "KeyError" in str(error)


def test_a_data_error_of_postgresql_is_terminal_on_the_driver_and_in_an_executor(
    spark: Any, pg_url: str, job_kind: str
) -> None:
    """A value PostgreSQL refuses (SQLSTATE class 22) fails the same way on every retry:
    terminal, where a lost connection is transient."""

    def refuse() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT '\"\\u0000\"'::jsonb ->> 0")

    in_executor = as_idem_error(_fail_job(spark, refuse, job_kind))
    with pytest.raises(psycopg.errors.DataError) as on_driver:
        refuse()
    driver_error = as_idem_error(on_driver.value)
    for error in (in_executor, driver_error):
        assert isinstance(error, errors.TerminalError), error
        assert str(error).startswith("PostgreSQL: UntranslatableCharacter: "), str(error)
