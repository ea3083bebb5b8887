"""Plan a batch of dropped files: one unit per file (its file key); slices sized over the whole batch.

Slices are planned over the batch's bytes, not per file: the pieces of every
pending file (line-aligned byte ranges cut while hashing) are laid end to end
and packed into about :data:`TARGET_SLICES` slices, whatever the number of
files. Ten files of 38 MB make the tasks one file of 387 MB makes (not ten times
as many), and a burst of small files shares a few tasks instead of paying a
task, a staging table per record type and an insert statement each.

The bytes of the last :data:`TAIL_SLICES` slices' worth are cut into slices a
quarter of the size: the apply of the slices staged last is the one part of a
commit that nothing overlaps, so the smaller they are, the shorter the wait.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from idem_platform.ledger import LedgerEntry
from idem_platform.sources.filedrop.files import DroppedFile, Split
from idem_platform.sources.filedrop.reader import BLOCK_BYTES, read_split
from idem_platform.write.batch import SourceBatch, Unit

SAMPLE_BLOCK_BYTES = 1 << 20  # a bounded sample reads small blocks from the start
TARGET_SLICES = 8  # slices of a batch big enough for them (more, smaller ones at the tail)
TAIL_SLICES = 2  # the last wave on two task slots, cut into quarters
# Below this a slice shares its task with the next pieces: a slice costs ~0.3 s of its own,
# more with many record types (each has its staging table, COPY and INSERT per slice). The
# 24,772-object 16-type STIX batch (15 MB): 4 slices in two waves took a median 6.65 s, 2 slices
# in one wave 6.26 s (2026-11-24, 5 alternating runs each); batches of 64 MB and more are cut
# by TARGET_SLICES, not by this.
MIN_SLICE_BYTES = 8 << 20


@dataclass(frozen=True)
class FileSlice:
    """What one Spark task reads: line-aligned pieces of one or more dropped files, in order."""

    parts: tuple[tuple[DroppedFile, Split], ...]

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(file.path for file, _ in self.parts))

    @property
    def size(self) -> int:
        return sum(split.end - split.start for _, split in self.parts)

    def restricted_to(self, unit_ids: set[str]) -> FileSlice | None:
        """The slice without the pieces of files not in ``unit_ids`` (``None`` if nothing is left)."""
        parts = tuple((file, split) for file, split in self.parts if file.path in unit_ids)
        return FileSlice(parts) if parts else None

    def read(
        self, index_of: Mapping[str, int], *, max_record_bytes: int, limit: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        block_bytes = SAMPLE_BLOCK_BYTES if limit is not None else BLOCK_BYTES
        for file, split in self.parts:
            yield from read_split(file, split, index_of[file.path], max_line_bytes=max_record_bytes, block_bytes=block_bytes)


def pack_slices(
    files: Sequence[DroppedFile], *, max_slice_bytes: int = 64 << 20, target_slices: int = TARGET_SLICES
) -> list[FileSlice]:
    """The batch's pieces, in file order, packed into slices sized over the batch's bytes.

    Aim: ``target_slices`` slices of ``total / target_slices`` bytes (at least
    :data:`MIN_SLICE_BYTES`, at most ``max_slice_bytes``), the last
    :data:`TAIL_SLICES` slices' worth of bytes cut into quarters. A slice ends at a
    piece boundary once it holds its share; it may span files (a file's pieces
    stay in order, so each of its lines is read exactly once). Empty files have
    no pieces and no slice.
    """
    pieces = [(file, split) for file in files for split in file.splits]
    total = sum(split.end - split.start for _, split in pieces)
    if not pieces:
        return []
    # The connector's split_bytes caps a slice, even under MIN_SLICE_BYTES: whoever sets it
    # small wants more, smaller tasks (a cluster with many executors, a test of retries).
    share = min(max_slice_bytes, max(MIN_SLICE_BYTES, -(-total // max(1, target_slices))))
    tail = min(share, max(MIN_SLICE_BYTES, share // 4))
    tail_start = total - TAIL_SLICES * share
    slices: list[FileSlice] = []
    current: list[tuple[DroppedFile, Split]] = []
    current_bytes = 0
    offset = 0  # bytes of the batch before the current slice
    for file, split in pieces:
        current.append((file, split))
        current_bytes += split.end - split.start
        if current_bytes >= (share if offset < tail_start else tail):
            slices.append(FileSlice(tuple(current)))
            offset += current_bytes
            current, current_bytes = [], 0
    if current:
        if slices and current_bytes < tail // 2:  # a remainder joins the last slice rather than cost a task
            slices[-1] = FileSlice(slices[-1].parts + tuple(current))
        else:
            slices.append(FileSlice(tuple(current)))
    return slices


def file_request(connector: str, key: str) -> dict[str, str]:
    """The ledger request of a dropped file: the file key under its connector."""
    return {"connector": connector, "file_key": key}


def file_unit(connector: str, file: DroppedFile) -> Unit:
    """A dropped file as a unit: positions ``<sha256[:16]>#L<line>``, located as ``path:line``."""
    return Unit(
        id=file.path,
        key=file.key,
        request=file_request(connector, file.key),
        position_prefix=f"{file.sha256[:16]}#L",
        label=file.path,
        records=file.lines,
        size=file.size,
        source={
            "file": file.path, "key": file.key, "bytes": file.size, "lines": file.lines,
            "mtime_ns": file.mtime_ns, "ctime_ns": file.ctime_ns, "inode": file.inode,
        },
    )


def batch_of_files(
    connector: str,
    files: Sequence[DroppedFile],
    entries: Mapping[str, LedgerEntry],
    *,
    max_slice_bytes: int = 64 << 20,
    target_slices: int = TARGET_SLICES,
) -> SourceBatch:
    """The batch of already hashed files given their ledger rows (slices: :func:`pack_slices`)."""
    pending: list[Unit] = []
    replayed: list[Unit] = []
    to_read: list[DroppedFile] = []
    priors = {}
    for file in files:
        unit = file_unit(connector, file)
        entry = entries.get(file.key)
        if entry is not None and entry.status == "committed":
            replayed.append(unit)
            priors[file.key] = entry.result or {}
        else:
            pending.append(unit)
            to_read.append(file)
    slices = pack_slices(to_read, max_slice_bytes=max_slice_bytes, target_slices=target_slices)
    return SourceBatch(
        connector=connector,
        kind="filedrop",
        pending=tuple(pending),
        slices=tuple(slices),
        replayed=tuple(replayed),
        priors=priors,
        planned_at=datetime.now(UTC).isoformat(),
    )
