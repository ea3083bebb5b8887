"""Landing a pushed body in a connector's drop directory, durably, under its content's name.

A request body becomes a file the file-drop path ingests like any other drop, so
HTTP, OTLP and files share one write path and one exactly-once story. The body is
spooled (in memory while small, else into a dotfile the sensor ignores) while its
SHA-256 and lines are counted, then published: fsync of the file, atomic rename to
``<sha256>.ndjson``, fsync of the directory. Only after that does the request's
ledger row commit, so an acknowledged body survives a power cut.

The name is the content's hash: a body landed twice (a retry whose first answer was
lost, two keys for one body) is one file, and the file ledger commits its rows once.

Spools and landed files are 0600, directories made here 0700 (bodies are data).
A spool file is ``flock``-ed by its writer from creation until it is renamed into
place or removed, so :func:`remove_stale_spools` (run when ``idem serve`` starts)
can tell the spool of a server killed mid-request (lock free) from one another
live server is writing (locked), and removes only the first.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from idem_platform.contract.keys import file_key_from_digest
from idem_platform.private_files import create_private, private_dir

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
        private_dir(self.directory)
        self._file = _create_locked(self.path)
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
        try:
            os.replace(self.path, target)  # still locked: a start-up sweep leaves it alone
        finally:
            handle.close()
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
            self.path.unlink(missing_ok=True)  # before closing, which drops the lock
            self._file.close()


def _create_locked(path: Path) -> BinaryIO:
    """A new 0600 spool file at ``path``, ``flock``-ed for as long as it is open.

    A sweep can lock and remove the file between its creation and our lock (it sees a
    file nobody holds); the file we then hold has no name left, so make it again.
    """
    while True:
        handle = create_private(path)
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        if os.fstat(handle.fileno()).st_nlink > 0:
            return handle
        handle.close()


def remove_stale_spools(directory: Path) -> list[Path]:
    """Remove the spool files in ``directory`` no live writer holds; returns them.

    Such a file is what a server killed mid-request (``kill -9``, a power cut) left:
    no ``202`` was sent for it and nothing else ever removes it. A spool another
    server is writing is locked and is left alone.
    """
    removed: list[Path] = []
    try:
        candidates = sorted(directory.glob(f"{_SPOOL_PREFIX}*.tmp"))
    except OSError:
        return removed
    for path in candidates:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # gone already (published or discarded meanwhile)
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                path.unlink()
                removed.append(path)
        except OSError:  # locked by its live writer, or renamed/removed meanwhile
            continue
        finally:
            os.close(descriptor)
    return removed
