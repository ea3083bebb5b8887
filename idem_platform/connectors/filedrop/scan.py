"""Which files in a drop directory are ready: the rules the sensor applies, without Dagster.

A file is *settled* when its size and mtime are the same on two looks (two
sensor ticks). Writers that cannot guarantee that can use the rename-into-place
convention instead: write ``.name.tmp`` (dotfiles are ignored) or ``name.part`` /
``name.partial`` / ``name.tmp`` (ignored suffixes), then rename to the final name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp")


@dataclass(frozen=True)
class Seen:
    """One look at a file."""

    size: int
    mtime_ns: int


def is_candidate(relative: Path) -> bool:
    """Not a dotfile, not inside a dot-directory, not an in-progress suffix."""
    return not any(part.startswith(".") for part in relative.parts) and not relative.name.endswith(
        IGNORED_SUFFIXES
    )


def look(directory: Path) -> dict[str, Seen]:
    """``{relative posix path: Seen}`` of the candidate files under ``directory`` (recursive)."""
    found: dict[str, Seen] = {}
    if not directory.is_dir():
        return found
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root) / name
            relative = path.relative_to(directory)
            if not is_candidate(relative):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed between listing and stat
                continue
            found[relative.as_posix()] = Seen(stat.st_size, stat.st_mtime_ns)
    return found
