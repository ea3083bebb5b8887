"""The Kafka sensor: committed offsets and the brokers' watermarks in, one run request for the lag.

Per tick it asks the brokers for every partition of the connector's topics
(new partitions are picked up as they appear) and their watermarks, reads the
committed offsets and the ledger rows of the ranges that would start there, and
requests one run with explicit ``{topic, partition, start, end}`` ranges for
the partitions that need one (:mod:`idem_platform.sources.kafka.lag`).
It requests nothing while a run of the connector's job is queued or running:
the next run starts where that one commits.

Broker down: the tick is skipped with the reason; nothing is requested, nothing
advances, and the next tick after the brokers return resumes from the committed
offsets.
"""

import json
from typing import Any

import dagster as dg

from idem_platform.config import KafkaConnector
from idem_platform.defs.connector.names import sensor_name
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.errors import KafkaError
from idem_platform.ledger import Ledger
from idem_platform.pipeline.commit import owner_alive
from idem_platform.sources.kafka.client import describe_partitions
from idem_platform.sources.kafka.lag import decide_all, partition_lags, run_key
from idem_platform.sources.kafka.offsets import committed_offsets
from idem_platform.sources.kafka.ranges import ranges_to_read

SENSOR_BROKER_TIMEOUT_SECONDS = 5.0
RANGES_TAG = "idem/kafka_ranges"
ACTIVE_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def build_kafka_sensor(
    connector: KafkaConnector, job: Any, ingest_op: str, resource_keys: ResourceKeys = DEFAULT_KEYS
) -> dg.SensorDefinition:
    """The sensor of one Kafka connector (``resource_keys``: whose ``idem_postgres`` holds its offsets)."""
    @dg.sensor(
        name=sensor_name(connector),
        job=job,
        minimum_interval_seconds=connector.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={resource_keys.postgres},
        description=(
            f"Compares the offsets committed in idem.source_offsets with the end of every partition of "
            f"{', '.join(connector.topics or [])} and requests one run for the lag, with explicit offset "
            "ranges. Run keys carry each range's attempt number, so a failed range is retried with a new "
            "key; nothing is requested while a run of the connector is in flight or the brokers are down."
        ),
    )
    def kafka_sensor(context: dg.SensorEvaluationContext, **_resources: Any) -> dg.SensorResult | dg.SkipReason:
        # Called directly, a sensor is handed its required resources as keyword arguments.
        postgres = resource_keys.postgres_of(context)
        active = context.instance.get_runs(filters=dg.RunsFilter(job_name=job.name, statuses=ACTIVE_STATUSES), limit=1)
        if active:
            return dg.SkipReason(f"run {active[0].run_id} of {job.name} is in flight; the next run starts where it commits")
        try:
            view = describe_partitions(connector, timeout=SENSOR_BROKER_TIMEOUT_SECONDS)
            states = view.partitions
        except KafkaError as exc:
            return dg.SkipReason(f"{exc}; nothing was requested and no offset moved")
        with postgres.connection() as conn, conn.transaction():
            committed = committed_offsets(conn, connector.name)
            ranges, held = ranges_to_read(connector, committed, states)
            entries = Ledger(conn, connector.name).entries(sorted({r.key for r in ranges}))
            in_progress = [k for k, e in entries.items() if e.status == "in_progress"]
            alive = owner_alive(conn, connector.name, in_progress)
        decisions = decide_all(ranges, entries, alive, connector.max_attempts)
        chosen = [d for d in decisions if d.range is not None]
        lags = partition_lags(states, committed)
        waiting = [f"{d.partition}: {d.reason}" for d in decisions if d.range is None] + held
        missing = view.missing_note()
        if missing:
            waiting.append(missing)
        cursor = json.dumps(
            {"v": 1, "lag": sum(p.lag for p in lags), "partitions": len(lags)}, separators=(",", ":")
        )
        if not chosen:
            total = sum(p.lag for p in lags)
            reason = f"{len(lags)} partition(s), lag {total}" + (f"; {'; '.join(waiting[:5])}" if waiting else "")
            return dg.SensorResult(skip_reason=reason, cursor=cursor)
        ranges_config = [
            {"topic": d.range.topic, "partition": d.range.partition, "start": d.range.start, "end": d.range.end}
            for d in chosen
            if d.range is not None
        ]
        request = dg.RunRequest(
            run_key=run_key(connector.name, chosen),
            run_config={"ops": {ingest_op: {"config": {"ranges": ranges_config}}}},
            tags={
                RANGES_TAG: ",".join(f"{r['topic']}-{r['partition']}@{r['start']}..{r['end']}" for r in ranges_config)[:4000],
                "idem/attempt": str(max(d.attempt or 1 for d in chosen)),
            },
        )
        if waiting:
            context.log.info("held back: %s", "; ".join(waiting[:20]))
        return dg.SensorResult(run_requests=[request], cursor=cursor)

    return kafka_sensor
