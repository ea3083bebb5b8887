"""Which files of a drop directory are settled, with their sha256, and the cursor that
remembers them between the file-drop sensor's ticks.

A file is run only once it stops changing (the same size, mtime, ctime and inode on
two looks) or, for a body ``idem serve`` landed, once it hashes to its name; it is
hashed once, in chunks, within a per-tick budget, so a tick over a big drop stays
short. The cursor carries each pending file's stamp, sha256 and the request that last
covered it, so nothing is hashed or asked twice.
"""

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from idem_platform.config import ConnectorConfig
from idem_platform.defs.filedrop.decisions import Asked
from idem_platform.errors import FileChangedError, RefusedFileError
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.push.landing import LANDED_SUFFIX

HASH_BUDGET_SECONDS = 20.0
_LANDED_NAME = re.compile(r"([0-9a-f]{64})" + re.escape(LANDED_SUFFIX))
CURSOR_VERSION = 4


@dataclass
class Cursor:
    """Per file still settling or not committed: ``[size, mtime_ns, ctime_ns, inode, sha256 or
    null]``, plus ``run_key, attempt, misses`` of the request that last covered it; per batch
    run key still remembered, its range ``[start, end]``."""

    files: dict[str, list[Any]]
    ranges: dict[str, list[str]]

    @classmethod
    def load(cls, cursor: str | None) -> "Cursor":
        if not cursor:
            return cls({}, {})
        try:
            data = json.loads(cursor)
            return cls(dict(data.get("files", {})), dict(data.get("ranges", {})))
        except (ValueError, AttributeError, TypeError):
            return cls({}, {})

    @staticmethod
    def asked(entry: list[Any]) -> Asked | None:
        if len(entry) >= 8 and isinstance(entry[5], str):
            return Asked(entry[5], int(entry[6]), int(entry[7]))
        return None

    def dump(self) -> str:
        remembered = {entry[5] for entry in self.files.values() if len(entry) >= 8}
        ranges = {key: span for key, span in self.ranges.items() if key in remembered}
        return json.dumps({"v": CURSOR_VERSION, "files": self.files, "ranges": ranges}, separators=(",", ":"))


def settled_files(
    directory: Path, connector: ConnectorConfig, seen: Mapping[str, Any], done: set[str], previous: Cursor
) -> tuple[Cursor, dict[str, str], dict[str, Asked]]:
    """The next cursor, the settled files with their sha256, and what was asked for them before.

    A file is hashed (in chunks) once it is settled and not hashed before, within the
    tick's hashing budget; a file that changed forgets its sha256 and its request.
    A body ``idem serve`` landed settles on its first look (:func:`_landed_whole`).
    """
    cursor = Cursor({}, dict(previous.ranges))  # only files settling or not committed yet
    ready: dict[str, str] = {}
    memory: dict[str, Asked] = {}
    budget_end = time.monotonic() + HASH_BUDGET_SECONDS
    for relative, now in seen.items():
        if relative in done:
            continue  # committed as it is now: never hashed again, not remembered
        before = previous.files.get(relative)
        settled = before is not None and tuple(before[:4]) == now.stamp
        sha = before[4] if settled and before is not None and len(before) > 4 else None
        named = None if settled else _landed_name(connector, relative)
        if (settled or named) and sha is None and time.monotonic() < budget_end:
            try:
                sha = hash_file(directory / relative, max_split_bytes=connector.split_bytes).sha256
            except (FileChangedError, FileNotFoundError, RefusedFileError):
                settled, named = False, None  # changed, gone, or swapped for a FIFO since the look: the next look decides
            if named:
                settled = _landed_whole(named, sha)
                sha = sha if settled else None
        cursor.files[relative] = [*now.stamp, sha]
        if settled and sha is not None:
            ready[relative] = sha
            asked = Cursor.asked(before) if before is not None else None
            if asked is not None:
                memory[relative] = asked
                cursor.files[relative] += [asked.run_key, asked.attempt, asked.misses]
    return cursor, ready, memory


def _landed_name(connector: ConnectorConfig, relative: str) -> str | None:
    """The sha256 a file of an http/otlp connector's landing directory is named by
    (``<sha256>.ndjson``, as ``idem serve`` lands bodies), else ``None``."""
    if connector.kind not in ("http", "otlp"):
        return None
    match = _LANDED_NAME.fullmatch(relative)
    return match.group(1) if match else None


def _landed_whole(named: str, sha: str | None) -> bool:
    """Whether a file named by a sha256 holds exactly the bytes that hash to it.

    ``idem serve`` writes a body to a dotfile, fsyncs it and renames it to its
    content's hash, so such a file is complete the moment it appears: waiting for a
    second look (a tick ``sensor_interval_seconds`` later) would only delay its run.
    Anything else under that name (a copy still being written, a file put there by
    hand) does not hash to it and settles the usual way, unchanged across two looks.
    """
    return sha is not None and sha == named

