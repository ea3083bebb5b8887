"""``idem offsets``: per Kafka partition, the committed offset, the log's end and the lag."""

from __future__ import annotations

import sys
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import IdemCommand, invocation, json_option
from idem_platform.cli.output import CommandError, terminal
from idem_platform.config import IdemConfig, KafkaConnector, load_config
from idem_platform.errors import KafkaError
from idem_platform.postgres import connect
from idem_platform.sources.kafka.client import describe_partitions
from idem_platform.sources.kafka.lag import partition_lags
from idem_platform.sources.kafka.offsets import offset_rows

COLUMNS = ("connector", "topic", "partition", "committed", "high", "lag")


@click.command("offsets", cls=IdemCommand)
@click.option("--connector", metavar="NAME", help="one Kafka connector (default: all)")
@json_option()
def offsets(connector: str | None) -> dict[str, Any] | None:
    """Per Kafka partition: committed offset, log end and lag."""
    url = prepare_environment()
    config = load_config(invocation().config)
    report = offsets_report(config, url, connector)
    if not terminal(invocation().json):
        return {"offsets": report}
    sys.stdout.write(offsets_table(report) + "\n")
    return None


def kafka_connectors(config: IdemConfig, name: str | None) -> list[KafkaConnector]:
    """The connector named (it must be a Kafka one), else every Kafka connector of the config."""
    if name is not None:
        connector = config.connector(name)
        if not isinstance(connector, KafkaConnector):
            raise CommandError(f"connector {name!r} is a {connector.kind} connector; it has no offsets")
        return [connector]
    found = [c for c in config.connectors if isinstance(c, KafkaConnector)]
    if not found:
        raise CommandError("no kafka connector in the config")
    return found


def offsets_report(config: IdemConfig, url: str, connector_name: str | None = None) -> list[dict[str, Any]]:
    """Per Kafka partition: the committed offset, the log's start and end, the lag.

    A connector whose brokers cannot be reached still lists its committed
    offsets, with ``error`` saying why the rest is missing.
    """
    connectors = kafka_connectors(config, connector_name)
    report: list[dict[str, Any]] = []
    with connect(url) as conn:
        stored = {(r["connector"], r["topic"], r["partition"]): r for r in offset_rows(conn, connector_name)}
    for connector in connectors:
        mine = {(t, p): r for (c, t, p), r in stored.items() if c == connector.name}
        try:
            states = describe_partitions(connector).partitions
        except KafkaError as exc:
            for (topic, partition), row in sorted(mine.items()):
                report.append({"connector": connector.name, "topic": topic, "partition": partition,
                               "committed": row["next_offset"], "low": None, "high": None, "lag": None,
                               "commit_id": row["commit_id"], "error": str(exc)})
            continue
        committed = {key: row["next_offset"] for key, row in mine.items()}
        for lag in partition_lags(states, committed):
            row = mine.get((lag.topic, lag.partition), {})
            report.append({"connector": connector.name, "topic": lag.topic, "partition": lag.partition,
                           "committed": lag.committed, "low": lag.low, "high": lag.high, "lag": lag.lag,
                           "commit_id": row.get("commit_id")})
    return report


def offsets_table(report: list[dict[str, Any]]) -> str:
    """The report as a table for people, then one line per broker error."""
    table = [[str(row.get(c) if row.get(c) is not None else "-") for c in COLUMNS] for row in report]
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in table]
    errors = sorted({row["error"] for row in report if row.get("error")})
    return "\n".join(lines + [f"error: {e}" for e in errors])
