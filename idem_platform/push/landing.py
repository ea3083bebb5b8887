"""Landing a pushed body in a connector's drop directory, durably, under its content's name.

A request body becomes a file the file-drop path ingests like any other drop, so
HTTP, OTLP and files share one write path and one exactly-once story. The body is
spooled into a dotfile (the sensor ignores dotfiles) while its SHA-256 and lines
are counted, then published: fsync of the file, atomic rename to
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

    def __init__(self, directory: Path, *, limit: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.limit = limit
        self.path = directory / f"{_SPOOL_PREFIX}{uuid.uuid4().hex}.tmp"
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by publish/discard
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
        self._file.write(chunk)
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

    def publish(self) -> LandedFile:
        """fsync, rename to ``<sha256>.ndjson`` and fsync the directory.

        A file of that name already there holds the same bytes (its name is their
        hash): it is left alone, so a reader never sees it replaced under it.
        """
        target = self.directory / f"{self.sha256}{LANDED_SUFFIX}"
        landed = LandedFile(self.file_key, target, self.lines, self.size)
        if self._file.closed:
            return landed
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if target.exists() and target.stat().st_size == self.size:
            self.path.unlink(missing_ok=True)
            return landed
        os.replace(self.path, target)
        directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return landed

    def discard(self) -> None:
        """Remove the spooled file (nothing happens after :meth:`publish`)."""
        if not self._file.closed:
            self._file.close()
            self.path.unlink(missing_ok=True)
