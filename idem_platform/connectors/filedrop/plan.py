"""Plan a batch of dropped files: one unit per file (its file key), one slice per split."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from idem_platform.connectors.batch import SourceBatch, Unit
from idem_platform.connectors.filedrop.files import DroppedFile, Split
from idem_platform.connectors.filedrop.reader import BLOCK_BYTES, read_split
from idem_platform.ledger import LedgerEntry

SAMPLE_BLOCK_BYTES = 1 << 20  # a bounded sample reads small blocks from the start


@dataclass(frozen=True)
class FileSlice:
    """One line-aligned byte range of a dropped file (one Spark task)."""

    file: DroppedFile
    split: Split

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return (self.file.path,)

    def read(
        self, index_of: Mapping[str, int], *, max_record_bytes: int, limit: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        return read_split(
            self.file,
            self.split,
            index_of[self.file.path],
            max_line_bytes=max_record_bytes,
            block_bytes=SAMPLE_BLOCK_BYTES if limit is not None else BLOCK_BYTES,
        )


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


def batch_of_files(connector: str, files: Sequence[DroppedFile], entries: Mapping[str, LedgerEntry]) -> SourceBatch:
    """The batch of already hashed files given their ledger rows."""
    pending: list[Unit] = []
    replayed: list[Unit] = []
    slices: list[FileSlice] = []
    priors = {}
    for file in files:
        unit = file_unit(connector, file)
        entry = entries.get(file.key)
        if entry is not None and entry.status == "committed":
            replayed.append(unit)
            priors[file.key] = entry.result or {}
        else:
            pending.append(unit)
            slices.extend(FileSlice(file, split) for split in file.splits)
    return SourceBatch(
        connector=connector,
        kind="filedrop",
        pending=tuple(pending),
        slices=tuple(slices),
        replayed=tuple(replayed),
        priors=priors,
        planned_at=datetime.now(UTC).isoformat(),
    )
