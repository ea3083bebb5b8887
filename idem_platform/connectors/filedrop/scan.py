"""Which files in a drop directory are ready: the rules the sensor applies, without Dagster.

A file is *settled* when its size and mtime are the same on two looks (two
sensor ticks). Writers that cannot guarantee that can use the rename-into-place
convention instead: write ``.name.tmp`` (dotfiles are ignored) or ``name.part`` /
``name.partial`` / ``name.tmp`` (ignored suffixes), then rename to the final name.
"""

from __future__ import annotations

import os
import stat as stat_module
from dataclasses import dataclass
from pathlib import Path

IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp")


@dataclass(frozen=True)
class Seen:
    """One look at a file: what tells a file from a rewritten one without reading it.

    Size and mtime alone can be restored by a writer (``touch -d``); the inode
    change time cannot be set from user space and moves on every write, and the
    inode number changes when a file is replaced by a rename.
    """

    size: int
    mtime_ns: int
    ctime_ns: int = 0
    inode: int = 0

    @classmethod
    def of(cls, stat: os.stat_result) -> Seen:
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)

    @property
    def stamp(self) -> tuple[int, int, int, int]:
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode)


def is_candidate(relative: Path) -> bool:
    """Not a dotfile, not inside a dot-directory, not an in-progress suffix."""
    return not any(part.startswith(".") for part in relative.parts) and not relative.name.endswith(
        IGNORED_SUFFIXES
    )


def look(directory: Path, refused: dict[str, str] | None = None) -> dict[str, Seen]:
    """``{relative posix path: Seen}`` of the candidate files under ``directory`` (recursive).

    Only regular files inside the directory are candidates: a symlink that leads
    out of it (``x.ndjson -> /etc/passwd``), a FIFO (reading it would block the
    tick), a socket or a device is left out, with the reason put in ``refused``.
    """
    found: dict[str, Seen] = {}
    if not directory.is_dir():
        return found
    root_dir = directory.resolve()
    for root, dirs, files in os.walk(directory):  # os.walk does not follow directory symlinks
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root) / name
            relative = path.relative_to(directory)
            if not is_candidate(relative):
                continue
            try:
                reason = refusal(path, root_dir)
                stat = path.stat()
            except FileNotFoundError:  # removed between listing and stat
                continue
            if reason is not None:
                if refused is not None:
                    refused[relative.as_posix()] = reason
                continue
            found[relative.as_posix()] = Seen.of(stat)
    return found


def refusal(path: Path, directory: Path) -> str | None:
    """Why ``path`` may not be ingested from ``directory`` (resolved), or ``None`` if it may.

    Raises:
        FileNotFoundError: it is gone (or a dangling symlink).
    """
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(directory):
            return f"a symlink out of the drop directory (to {target}), not read"
    mode = path.stat().st_mode
    if stat_module.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat_module.S_ISFIFO(mode) else "a socket" if stat_module.S_ISSOCK(mode) else "not a regular file"
    return f"{kind}, not read"
