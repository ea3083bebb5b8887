"""Hash a dropped file once, in chunks, into its file key and its line-aligned pieces.

A 2 GB file is never read into memory: it is read in 8 MiB chunks that feed
SHA-256 (the file key), count newlines and cut byte-range *pieces* of about
:data:`PIECE_BYTES` at line boundaries. Each piece knows its first line number
(so positions ``#L<line>`` stay exact when executors read pieces in parallel)
and the CRC-32 of its bytes (so an executor notices when the file changed after
it was hashed, and the batch fails instead of committing rows that do not match
the key).

Pieces are the grain, not the tasks: the batch's planner
(:mod:`idem_platform.sources.filedrop.plan`) packs the pieces of every file of
a batch into read slices sized over the whole batch, so ten files make as many
Spark tasks as one file of the same bytes, and a thousand small files share a
handful of tasks.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from idem_platform.contract.keys import file_key_from_digest
from idem_platform.errors import FileChangedError, RefusedFileError
from idem_platform.sources.filedrop.scan import kind_of, refused_text

CHUNK_BYTES = 8 << 20
MIN_SPLIT_BYTES = 1 << 20
PIECE_BYTES = 2 << 20  # the grain slices are packed from: fine enough for the batch's last, small slices


@dataclass(frozen=True)
class Split:
    """A byte range ``[start, end)`` of a file that starts at a line boundary."""

    start: int
    end: int
    first_line: int
    crc32: int


@dataclass(frozen=True)
class DroppedFile:
    """A dropped file as hashed: identity, size and its line-aligned pieces (``splits``)."""

    path: str
    sha256: str
    size: int
    mtime_ns: int
    lines: int
    splits: tuple[Split, ...]
    ctime_ns: int = 0  # with the inode: a file rewritten with its size and mtime restored is another file
    inode: int = 0

    @property
    def key(self) -> str:
        """The file key ``filedrop:<sha256>``."""
        return file_key_from_digest(self.sha256)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DroppedFile:
        splits = tuple(Split(**s) for s in data["splits"])
        return cls(**{**data, "splits": splits})


def split_size_for(size: int, max_split_bytes: int) -> int:
    """Bytes per piece: :data:`PIECE_BYTES`, never more than the connector's ``split_bytes``
    (``size`` is the file's; a file smaller than one piece is one piece)."""
    return max(MIN_SPLIT_BYTES, min(max_split_bytes, PIECE_BYTES, max(size, 1)))


# (resolved path, size, mtime_ns, ctime_ns, inode, max_split_bytes) -> what hashing it gave
_recent: OrderedDict[tuple[str, int, int, int, int, int], DroppedFile] = OrderedDict()
_RECENT_LIMIT = 64


def hash_file(path: str | Path, *, max_split_bytes: int = 64 << 20, chunk_bytes: int = CHUNK_BYTES) -> DroppedFile:
    """Read ``path`` once: SHA-256, line count and line-aligned splits.

    The result is remembered per process for an unchanged file (same path, size
    and mtime), so planning twice in one run (the CLI's pre-check, then the
    ``ingest`` step) reads the file once. Should the bytes change without the
    size or mtime changing, the executors' per-split CRC check still refuses them.

    Raises:
        FileChangedError: the file's size or mtime changed while it was read.
        OSError: it cannot be read.
    """
    path = Path(path)
    before = path.stat()
    kind = kind_of(before.st_mode)
    if kind is not None:
        raise RefusedFileError(f"{path}: {refused_text(kind)}")
    memo = (os.fspath(path.resolve()), before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino, max_split_bytes)
    if memo in _recent:
        _recent.move_to_end(memo)
        return _recent[memo]
    hashed = _hash(path, before, max_split_bytes, chunk_bytes)
    if chunk_bytes == CHUNK_BYTES:
        _recent[memo] = hashed
        while len(_recent) > _RECENT_LIMIT:
            _recent.popitem(last=False)
    return hashed


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, unbuffered, if it is a regular file; never blocks.

    Whoever checked the file before (the sensor's look, ``idem ingest``, the asset)
    saw a regular file, but a FIFO may have been put in its place since: a plain
    ``open`` would then wait for a writer for ever. ``O_NONBLOCK`` makes the open
    return at once, and ``fstat`` on what was opened refuses anything not regular.

    Raises:
        RefusedFileError: it is not a regular file.
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind is not None:
            raise RefusedFileError(f"{path}: {refused_text(kind)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _hash(path: Path, before: os.stat_result, max_split_bytes: int, chunk_bytes: int) -> DroppedFile:
    split_bytes = split_size_for(before.st_size, max_split_bytes)
    sha = hashlib.sha256()
    splits: list[Split] = []
    newlines = 0
    split_start, split_first_line, crc = 0, 1, 0
    chunk_start = 0
    last_byte = b""
    with open_regular(path) as handle:
        while chunk := handle.read(chunk_bytes):
            sha.update(chunk)
            view = memoryview(chunk)
            done = 0  # bytes of this chunk already assigned to a split
            while True:
                boundary = split_start + split_bytes - chunk_start
                if boundary >= len(chunk):
                    break
                newline = chunk.find(b"\n", max(boundary, done))
                if newline < 0:
                    break
                end = newline + 1
                crc = zlib.crc32(view[done:end], crc)
                newlines += chunk.count(b"\n", done, end)
                splits.append(Split(split_start, chunk_start + end, split_first_line, crc))
                split_start, split_first_line, crc, done = chunk_start + end, newlines + 1, 0, end
            crc = zlib.crc32(view[done:], crc)
            newlines += chunk.count(b"\n", done)
            chunk_start += len(chunk)
            last_byte = chunk[-1:]
    after = path.stat()
    stamp = (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino)
    if stamp != (before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino) or chunk_start != after.st_size:
        raise FileChangedError(f"{path} changed while it was being hashed; it will be read again")
    if split_start < chunk_start:
        splits.append(Split(split_start, chunk_start, split_first_line, crc))
    lines = newlines + (1 if chunk_start and last_byte != b"\n" else 0)
    return DroppedFile(
        path=os.fspath(path.resolve()),
        sha256=sha.hexdigest(),
        size=after.st_size,
        mtime_ns=after.st_mtime_ns,
        ctime_ns=after.st_ctime_ns,
        inode=after.st_ino,
        lines=lines,
        splits=tuple(splits),
    )
