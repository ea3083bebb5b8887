"""The Kafka connector in tests: its config (one connector ``events`` routing threat-feed
records), its ingest in process, and the oracle of what a set of messages must commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from idem_platform.coercion.records import coerce_batch
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import rows

TABLES = ("indicator", "malware", "threat-actor")

KAFKA_CONFIG = """
connectors:
  - name: events
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topics}]
    record_type_field: type
    id_field: id
    {extra}
tables:
  indicator:
    columns:
      name: {{type: string, required: true}}
      confidence: int
      score: real
      created: timestamp
      embedding: vector(8)
      tags: dynamic
      active: bool
  malware:
    columns:
      name: {{type: string, required: true}}
      family: string
      first_seen: timestamp
      sample_size: long
      is_packed: bool
      labels: dynamic
  threat-actor:
    columns:
      name: {{type: string, required: true}}
      aliases: dynamic
      sophistication: int
      score: real
      last_seen: timestamp
      observed_count: long
spark:
  master: local[2]
"""


def kafka_config(directory: Path, bootstrap: str, topics: list[str], extra: str = "", *, pg_url: str | None = None) -> IdemConfig:
    """An idem.yaml with one Kafka connector ``events`` routing threat-feed records; tables synced."""
    config = write_config(directory, KAFKA_CONFIG.format(bootstrap=bootstrap, topics=", ".join(topics), extra=extra))
    if pg_url is not None:
        from idem_platform.pipeline.ingest import prepare_tables

        prepare_tables(pg_url, config, config.connector("events"))
    return config


def ingest(url: str, config: IdemConfig, spark: Any, name: str = "events", **request: Any) -> dict[str, Any]:
    """Plan the connector's lag, coerce, commit: what the ``ingest`` → ``committed`` assets do."""
    connector = config.connector(name)
    pipeline.prepare_tables(url, config, connector)
    batch = pipeline.plan_batch(url, connector)
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))
    return run.commit_batch(run.CommitRequest(url=url, connector=connector, run_id="test", **request), coerced, lambda: spark)


def stored_keys(url: str) -> set[str]:
    """The idempotency keys of every row in the three tables."""
    return {key for table in TABLES for (key,) in rows(url, f'SELECT _idempotency_key FROM idem.{table_name(table)}')}


def expected_keys(config: IdemConfig, messages: list[tuple[int, bytes | None, bytes | None, Any]], topic: str) -> set[str]:
    """The keys the coercion gives these messages (computed here, without Spark or a broker)."""
    return expected_outcome(config, messages, topic)[0]


def expected_outcome(
    config: IdemConfig, messages: list[tuple[int, bytes | None, bytes | None, Any]], topic: str
) -> tuple[set[str], int]:
    """The keys and the number of rejects the coercion gives these messages."""
    import pyarrow as pa

    from idem_platform.write.batch import RECORDS_SCHEMA, Unit

    connector = config.connector("events")
    partitions = sorted({m[0] for m in messages})
    units = [Unit(id=f"{topic}-{p}", key="k", request={}, position_prefix=f"{topic}-{p}@", label="", records=0, source={}) for p in partitions]
    spec = pipeline.record_spec(connector, config.tables_for(connector), units)
    keys: set[str] = set()
    rejects = 0
    for index, partition in enumerate(partitions):
        values = [m[2] for m in messages if m[0] == partition]
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([index] * len(values), pa.int32()),
                pa.array(range(len(values)), pa.int64()),
                pa.array(values, pa.binary()),
                pa.array([len(v or b"") for v in values], pa.int64()),
                pa.nulls(len(values), pa.string()),
                pa.nulls(len(values), pa.int64()),
            ],
            schema=RECORDS_SCHEMA,
        )
        coerced = coerce_batch(batch, spec)
        keys |= {k for k in coerced.column("_idempotency_key").to_pylist() if k}
        rejects += coerced.num_rows - coerced.column("_errors").null_count
    return keys, rejects
