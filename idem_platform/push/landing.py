"""Landing a pushed body in a connector's drop directory, durably, under its content's name.

A request body becomes a file the file-drop path ingests like any other drop, so
HTTP, OTLP and files share one write path and one exactly-once story. The body is
spooled (in memory while small, else into a dotfile the sensor ignores) while its
SHA-256 and lines are counted, then published: fsync of the file, atomic rename to
``<sha256>.ndjson``, fsync of the directory. Only after that does the request's
ledger row commit, so an acknowledged body survives a power cut.

The name is the content's hash: a body landed twice (a retry whose first answer was
lost, two keys for one body) is one file, and the file ledger commits its rows once.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from idem_platform.keys import file_key_from_digest

LANDED_SUFFIX = ".ndjson"
_SPOOL_PREFIX = ".push-"


class BodyTooLarge(Exception):
    """The body passed the connector's ``max_body_bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than this connector's max_body_bytes ({limit} bytes)")
        self.limit = limit


@dataclass(frozen=True)
class LandedFile:
    """A published body: what the ``202`` answer and the ledger row record."""

    file_key: str
    path: Path
    lines: int
    bytes: int


class Spool:
    """A body being received into a hidden file beside its final place.

    Feed it chunks with :meth:`write`; then :meth:`publish` it, or :meth:`discard`
    it (a replay, a refusal). Used as a context manager, an unpublished spool is
    always removed.
    """

    def __init__(self, directory: Path, *, limit: int, in_memory: int = 1 << 20) -> None:
        self.directory = directory
        self.limit = limit
        self.in_memory = in_memory
        self.path = directory / f"{_SPOOL_PREFIX}{uuid.uuid4().hex}.tmp"
        # Small bodies stay in memory until published: a replay, the common retry, then
        # costs no file created and deleted. Larger ones spill to the dotfile as they come.
        self._buffer: bytearray | None = bytearray()
        self._file: BinaryIO | None = None
        self._done = False
        self._digest = hashlib.sha256()
        self.size = 0
        self._newlines = 0
        self._last = b""

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def write(self, chunk: bytes) -> None:
        """Append a chunk; raises :class:`BodyTooLarge` past the limit (the spool is kept
        until :meth:`discard`)."""
        if not chunk:
            return
        self.size += len(chunk)
        if self.size > self.limit:
            raise BodyTooLarge(self.limit)
        if self._buffer is not None and self.size > self.in_memory:
            self._spill()
        if self._buffer is not None:
            self._buffer += chunk
        else:
            self._opened().write(chunk)
        self._digest.update(chunk)
        self._newlines += chunk.count(b"\n")
        self._last = chunk[-1:]

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of what was written so far."""
        return self._digest.hexdigest()

    @property
    def file_key(self) -> str:
        """The file key the file-drop path will give this body (DESIGN §2)."""
        return file_key_from_digest(self.sha256)

    @property
    def lines(self) -> int:
        """Lines of the body (a last line without a newline counts)."""
        return self._newlines + (1 if self._last and self._last != b"\n" else 0)

    def _spill(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by publish/discard
        if self._buffer:
            self._file.write(self._buffer)
        self._buffer = None

    def _opened(self) -> BinaryIO:
        if self._file is None:
            self._spill()
        if self._file is None:  # _spill opened it
            raise RuntimeError("the spool file could not be opened")
        return self._file

    def publish(self) -> LandedFile:
        """fsync, rename to ``<sha256>.ndjson`` and fsync the directory.

        A file of that name already there holds the same bytes (its name is their
        hash): it is left alone, so a reader never sees it replaced under it.
        """
        target = self.directory / f"{self.sha256}{LANDED_SUFFIX}"
        landed = LandedFile(self.file_key, target, self.lines, self.size)
        if self._done:
            return landed
        self._done = True
        if target.exists() and target.stat().st_size == self.size:
            self._close_and_remove()
            return landed
        handle = self._opened()
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(self.path, target)
        directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return landed

    def discard(self) -> None:
        """Forget the body (nothing happens after :meth:`publish`)."""
        if not self._done:
            self._done = True
            self._close_and_remove()

    def _close_and_remove(self) -> None:
        self._buffer = None
        if self._file is not None:
            self._file.close()
            self.path.unlink(missing_ok=True)
