"""librdkafka settings and the driver's questions to the brokers (partitions, watermarks).

Every client idem creates gets the connector's ``client_config`` (security
settings pass straight through) plus the settings exactly-once reading depends
on, which users cannot override (:data:`~idem_platform.config.MANAGED_KAFKA_SETTINGS`).
librdkafka's own log lines go to the ``idem.kafka`` Python logger instead of
stderr, so a broker that is down costs one clear error, not a screen of retries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from idem_platform.config import KafkaConnector
from idem_platform.errors import ConfigError, KafkaError

LOG = logging.getLogger("idem.kafka")
# librdkafka retries a broker that is down several times a second, each with a log line:
# without this, a sensor tick against a stopped broker prints hundreds of them. The
# failure itself reaches the caller as an exception; set LOG.propagate = True to see them.
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
QUERY_TIMEOUT_SECONDS = 10.0


def client_settings(connector: KafkaConnector) -> dict[str, Any]:
    """Settings every client of ``connector`` shares (brokers, security, client id)."""
    if not connector.bootstrap_servers:
        raise ConfigError(f"connector {connector.name!r} has no bootstrap_servers")
    return {
        **connector.client_config,
        "bootstrap.servers": connector.bootstrap_servers,
        "client.id": f"idem-{connector.name}",
    }


def reader_settings(connector: KafkaConnector) -> dict[str, Any]:
    """A consumer that reads assigned offsets only: no group join, no auto commit, no silent reset."""
    return {
        **client_settings(connector),
        "group.id": connector.group,  # never joined: only named (librdkafka wants one)
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    }


def consumer(settings: dict[str, Any]) -> Any:
    """A ``confluent_kafka.Consumer`` whose log lines go to :data:`LOG`."""
    # Late import (confluent_kafka): off idem --help's imports and file-only runs'.
    from confluent_kafka import Consumer

    return Consumer(settings, logger=LOG)


@dataclass(frozen=True)
class BrokerView:
    """The connector's partitions as the brokers see them, and its topics they do not know (yet)."""

    partitions: dict[tuple[str, int], PartitionState]
    missing: tuple[str, ...] = ()

    def missing_note(self) -> str | None:
        if not self.missing:
            return None
        return f"topic(s) {', '.join(self.missing)} not in the cluster yet (read as soon as they exist)"


@dataclass(frozen=True)
class PartitionState:
    """What the brokers say about one partition right now."""

    topic: str
    partition: int
    low: int  # the log start: older offsets were deleted by retention
    high: int  # the end a read_committed reader can reach (last stable offset)


def describe_partitions(
    connector: KafkaConnector,
    *,
    only: Iterable[tuple[str, int]] | None = None,
    timeout: float = QUERY_TIMEOUT_SECONDS,
) -> BrokerView:
    """Every partition of the connector's topics (or ``only`` these) with its watermarks.

    A topic the cluster does not know is listed as missing, not an error: the
    other topics are read, and its partitions as soon as it is created.

    Raises:
        KafkaError: the brokers cannot be reached within ``timeout``.
    """
    # Late import (confluent_kafka): off idem --help's imports and file-only runs'.
    from confluent_kafka import KafkaException, TopicPartition

    wanted = set(only) if only is not None else None
    client = consumer(reader_settings(connector))
    try:
        try:
            metadata = client.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise KafkaError(
                f"Kafka brokers {connector.bootstrap_servers} unreachable: {_describe(exc)}"
            ) from None
        states: dict[tuple[str, int], PartitionState] = {}
        missing: list[str] = []
        for topic in connector.topics or []:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                missing.append(topic)
                continue
            for partition in sorted(found.partitions):
                if wanted is not None and (topic, partition) not in wanted:
                    continue
                try:
                    low, high = client.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout, cached=False
                    )
                except KafkaException as exc:
                    raise KafkaError(f"{topic}-{partition}: watermarks unavailable: {_describe(exc)}") from None
                states[(topic, partition)] = PartitionState(topic, partition, int(low), int(high))
        return BrokerView(states, tuple(missing))
    finally:
        client.close()


def _describe(exc: Exception) -> str:
    """``NAME: text`` of a KafkaException (its first argument is a KafkaError)."""
    error = exc.args[0] if exc.args else exc
    name = getattr(error, "name", None)
    text = getattr(error, "str", None)
    if callable(name) and callable(text):
        return f"{name()}: {text()}"
    return str(exc)
