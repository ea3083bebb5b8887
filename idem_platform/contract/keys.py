"""The four keys of DESIGN §2, exactly as the spec vectors in ``shared/spec/`` pin them.

* record key  ``<connector>:<record_type>:<ext_id>:<sha1(canonical)[:12]>``: one per
  row (``_idempotency_key``), identical whichever path (file, Kafka, HTTP) brought
  the record, because it depends only on the record as received;
* file key    ``filedrop:<sha256 of the whole file>``: one per dropped file;
* minted key  SHA-256 of length-prefixed parts: for outbound calls, unambiguous
  (``["ab", "c"]`` and ``["a", "bc"]`` differ);
* caller key  a validated ``Idempotency-Key`` header.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from idem_platform.errors import KeyValidationError

NAME_PATTERN = re.compile(r"[a-z0-9_-]{1,64}")
MAX_KEY_LENGTH = 255
FILE_KEY_PREFIX = "filedrop:"
HASHED_EXT_ID_PREFIX = "sha1~"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def content_hash(canonical: bytes) -> str:
    """SHA-1 hex of the canonical bytes; the key uses its first 12 characters."""
    return hashlib.sha1(canonical).hexdigest()


def ext_id_text(value: Any) -> str | None:
    """The ext_id text of an id field value, or ``None`` when it is missing or null.

    A string is taken as-is; a number or bool becomes its canonical JSON text
    (``7`` → ``"7"``, ``true`` → ``"true"``, ``1.0`` → ``"1.0"``).

    Raises:
        TypeError: for an object or array (the row is a reject).
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value, allow_nan=False)
    raise TypeError(f"is a JSON {'object' if isinstance(value, dict) else 'array'}, not a scalar")


def record_key(connector: str, record_type: str, ext_id: str, digest: str) -> str:
    """Build the record key; an ext_id that is unsafe or too long is hashed.

    Args:
        connector: the connector name (``[a-z0-9_-]{1,64}``).
        record_type: the record type name (same alphabet).
        ext_id: the ext_id text (see :func:`ext_id_text`) or a position.
        digest: :func:`content_hash` of the canonical record (40 hex, or at least 12).
    """
    key = f"{connector}:{record_type}:{ext_id}:{digest[:12]}"
    # Printable ASCII has no control characters: skip the regex for the common case.
    if len(key) > MAX_KEY_LENGTH or not (ext_id.isascii() and ext_id.isprintable()) and _CONTROL.search(ext_id):
        hashed = HASHED_EXT_ID_PREFIX + hashlib.sha1(ext_id.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"{connector}:{record_type}:{hashed}:{digest[:12]}"
    return key


def record_keys(connector: str, record_types: list[str], ext_ids: list[str], digests: list[str]) -> list[str]:
    """:func:`record_key` of each record of a batch: the same keys, built a batch at a time.

    Every key is hashed by :func:`record_key` itself as soon as one could need it (an ext_id
    long enough to make a key too long, or one with a character outside printable ASCII):
    the batch checks are whole-batch ones (one scan of all the ext_ids' bytes), cheaper than
    a check per key, and never decide a key differently.
    """
    if not ext_ids:
        return []
    longest = len(connector) + max(map(len, record_types)) + max(map(len, ext_ids)) + 3 + 12
    joined = "".join(ext_ids)
    if longest > MAX_KEY_LENGTH or not joined.isascii() or _has_control(joined.encode("ascii")):
        return list(map(record_key, [connector] * len(ext_ids), record_types, ext_ids, digests))
    prefix = connector + ":"
    return [f"{prefix}{t}:{e}:{d[:12]}" for t, e, d in zip(record_types, ext_ids, digests, strict=True)]


def _has_control(text: bytes) -> bool:
    """Whether ASCII ``text`` holds a control character (< 0x20, 0x7F): the only printable-ASCII
    test :func:`record_key` makes, for a whole batch at once."""
    codes = np.frombuffer(text, dtype=np.uint8)
    return bool(((codes < 0x20) | (codes == 0x7F)).any())


def record_key_of(connector: str, record_type: str, ext_id: str, canonical: bytes) -> str:
    """Convenience: the record key straight from canonical bytes."""
    return record_key(connector, record_type, ext_id, content_hash(canonical))


def file_key_from_digest(sha256_hex: str) -> str:
    """``filedrop:<sha256>`` from an already computed hex digest."""
    return FILE_KEY_PREFIX + sha256_hex


def file_key(data: bytes) -> str:
    """The file key of a whole file's bytes (small inputs; files are hashed in chunks)."""
    return file_key_from_digest(hashlib.sha256(data).hexdigest())


def file_position(file_sha256: str, line: int) -> str:
    """A record's position in a dropped file: ``<sha256[:16]>#L<line>`` (lines from 1)."""
    return f"{file_sha256[:16]}#L{line}"


def kafka_position(topic: str, partition: int, offset: int) -> str:
    """A record's position in a Kafka topic: ``<topic>-<partition>@<offset>``."""
    return f"{topic}-{partition}@{offset}"


def minted_key(parts: Sequence[str] | Iterable[str]) -> str:
    """SHA-256 hex of the length-prefixed encoding of ``parts``.

    Encoding: 4-byte big-endian part count, then for each part its 4-byte
    big-endian UTF-8 length and its bytes.
    """
    encoded = [part.encode("utf-8") for part in parts]
    digest = hashlib.sha256(struct.pack(">I", len(encoded)))
    for part in encoded:
        digest.update(struct.pack(">I", len(part)))
        digest.update(part)
    return digest.hexdigest()


def parse_caller_key(header: str | None) -> str | None:
    """Validate a caller's ``Idempotency-Key`` header.

    Returns:
        The trimmed key, or ``None`` when no header was sent.

    Raises:
        KeyValidationError: blank, longer than 255 characters, or containing
            control characters (< 0x20, 0x7F).
    """
    if header is None:
        return None
    key = header.strip()
    if not key:
        raise KeyValidationError("Idempotency-Key is blank")
    if len(key) > MAX_KEY_LENGTH:
        raise KeyValidationError(
            f"Idempotency-Key is {len(key)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    match = _CONTROL.search(key)
    if match:
        raise KeyValidationError(
            f"Idempotency-Key contains control character 0x{ord(match.group()):02x} "
            f"at position {match.start()}"
        )
    return key
