"""Read exactly one run of offsets of one partition, by assignment; runs on executors.

The task's consumer assigns itself ``[start, end)`` of its partition (no group
join, no rebalance) with ``isolation.level=read_committed`` and
``auto.offset.reset=error``: offsets deleted by retention since planning are an
error, never a silent jump. Offsets may have holes (transaction markers,
aborted or compacted messages); the range ends at the first message at or past
``end``, or at the partition's end once it reaches ``end``.

Messages become :data:`~idem_platform.write.batch.RECORDS_SCHEMA` batches:
the value as raw bytes (``None`` for a tombstone), the offset, the message
timestamp, and the key, headers and timestamp as ``_meta`` JSON.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from idem_platform.coercion.records import RAW_CAP
from idem_platform.errors import KafkaError, OffsetGapError
from idem_platform.sources.kafka.client import consumer as new_consumer
from idem_platform.write.batch import RECORDS_SCHEMA

MESSAGES_PER_POLL = 5000
_TIMESTAMP_TYPES = {1: "create", 2: "log_append"}


@dataclass(frozen=True)
class KafkaSlice:
    """Offsets ``[start, end)`` of one partition (one Spark task)."""

    unit: str
    topic: str
    partition: int
    start: int
    end: int
    settings: dict[str, Any]
    read_timeout_seconds: float = 60.0

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return (self.unit,)

    def read(
        self, index_of: Mapping[str, int], *, max_record_bytes: int, limit: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        end = self.end if limit is None else min(self.end, self.start + limit)
        return read_range(self, index_of[self.unit], end, max_record_bytes=max_record_bytes)


def _text_or_base64(value: bytes | str) -> Any:
    """Metadata bytes (or a name) as text, or ``{"base64": ...}`` when PostgreSQL cannot keep
    them as text: not UTF-8, or holding NUL (U+0000 is valid UTF-8, but jsonb and text refuse
    it, and every Confluent Schema Registry key starts with a 0x00 magic byte). Such a key
    once failed its whole range's commit, and every later message of the partition with it."""
    if isinstance(value, str):
        if "\x00" not in value:
            return value
        value = value.encode("utf-8", "surrogatepass")
    if b"\x00" not in value:  # in UTF-8, a 0x00 byte is U+0000 and nothing else
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"base64": base64.b64encode(value).decode("ascii")}


def message_meta(topic: str, partition: int, offset: int, key: bytes | None, headers: Any, timestamp: tuple[int, int]) -> str:
    """A message's metadata as JSON: where it is, its key, headers and timestamp.

    Keys, header names and header values are kept as text where PostgreSQL can store them
    as such, else as base64 (:func:`_text_or_base64`); topics cannot hold NUL.
    """
    meta: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
    if key is not None:
        meta["key"] = _text_or_base64(key)
    if headers:
        meta["headers"] = [
            [_text_or_base64(name), None if value is None else _text_or_base64(value)] for name, value in headers
        ]
    kind, stamp = timestamp
    if kind in _TIMESTAMP_TYPES:
        meta["timestamp"] = stamp
        meta["timestamp_type"] = _TIMESTAMP_TYPES[kind]
    return orjson.dumps(meta).decode("utf-8")


def read_range(piece: KafkaSlice, unit_index: int, end: int, *, max_record_bytes: int) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``[piece.start, end)`` as record batches.

    Raises:
        OffsetGapError: offsets of the range were deleted (retention) after it was planned.
        KafkaError: the broker failed, or the range stopped advancing for
            ``read_timeout_seconds`` (broker down, a transaction left open).
    """
    # Late import (confluent_kafka): off idem --help's imports and file-only runs'.
    from confluent_kafka import KafkaError as RdKafkaError
    from confluent_kafka import TopicPartition

    if end <= piece.start:
        return
    topic, partition = piece.topic, piece.partition
    where = f"{topic}-{partition}"
    client = new_consumer(piece.settings)
    try:
        client.assign([TopicPartition(topic, partition, piece.start)])
        position = piece.start
        last_progress = time.monotonic()
        while position < end:
            messages = client.consume(num_messages=min(MESSAGES_PER_POLL, end - position), timeout=1.0)
            offsets: list[int] = []
            values: list[bytes | None] = []
            lengths: list[int] = []
            metas: list[str] = []
            stamps: list[int | None] = []
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == RdKafkaError._PARTITION_EOF:
                        if message.offset() >= end:
                            position = end  # the partition ends where the range does
                        continue  # ended early: a transaction still open; wait for it
                    if error.code() == RdKafkaError.OFFSET_OUT_OF_RANGE:
                        raise OffsetGapError(
                            f"{where}: offset {position} is no longer in the log (retention deleted it "
                            f"after the range [{piece.start}, {end}) was planned); nothing was committed"
                        )
                    raise KafkaError(f"{where} at offset {position}: {error.name()}: {error.str()}")
                offset = message.offset()
                if offset >= end:
                    position = end
                    break
                value = message.value()
                offsets.append(offset)
                if value is not None and len(value) > max_record_bytes:
                    values.append(value[:RAW_CAP])
                else:
                    values.append(value)
                lengths.append(0 if value is None else len(value))
                kind, stamp = message.timestamp()
                stamps.append(stamp if kind in _TIMESTAMP_TYPES else None)
                metas.append(message_meta(topic, partition, offset, message.key(), message.headers(), (kind, stamp)))
                position = offset + 1
            if offsets:
                last_progress = time.monotonic()
                count = len(offsets)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([unit_index] * count, pa.int32()),
                        pa.array(offsets, pa.int64()),
                        pa.array(values, pa.binary()),
                        pa.array(lengths, pa.int64()),
                        pa.array(metas, pa.string()),
                        pa.array(stamps, pa.int64()),
                    ],
                    schema=RECORDS_SCHEMA,
                )
            elif position < end and time.monotonic() - last_progress > piece.read_timeout_seconds:
                raise KafkaError(
                    f"{where}: no message past offset {position} for {piece.read_timeout_seconds:.0f}s, but the "
                    f"range ends at {end} (broker unreachable, or a transaction still open); nothing was committed"
                )
    finally:
        client.close()
