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


SYMLINK_OUT = "a symlink out of the drop directory"
_KINDS = (
    (stat_module.S_ISFIFO, "a FIFO"),
    (stat_module.S_ISSOCK, "a socket"),
    (stat_module.S_ISCHR, "a character device"),
    (stat_module.S_ISBLK, "a block device"),
    (stat_module.S_ISDIR, "a directory"),
)


def kind_of(mode: int) -> str | None:
    """``None`` for a regular file, else what it is (``"a FIFO"``, ``"a socket"``, ...)."""
    if stat_module.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def refused_because(path: Path, directory: Path, *, whole_path: bool = True) -> str | None:
    """Why ``path``, a name inside ``directory`` (resolved), may not be read, or ``None``.

    It leads out of the directory through a symlink (``SYMLINK_OUT (to <target>)``),
    or it is not a regular file (:func:`kind_of`). Only ``stat``: nothing is opened,
    since opening a FIFO blocks until a writer comes. The sensor, the ``ingest``
    asset and ``idem ingest`` all ask this, so they refuse the same files in the same
    words. ``whole_path=False`` (the sensor's walk, which follows no directory
    symlink) resolves only a final component that is itself a symlink.

    Raises:
        FileNotFoundError: it is gone (or a dangling symlink).
    """
    if whole_path or path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(directory):
            return f"{SYMLINK_OUT} (to {target})"
    return kind_of(path.stat().st_mode)


def refusal(path: Path, directory: Path) -> str | None:
    """The sensor's skip text for ``path`` (``"a FIFO, not read"``), or ``None`` if it may be read.

    Raises:
        FileNotFoundError: it is gone (or a dangling symlink).
    """
    reason = refused_because(path, directory, whole_path=False)
    return None if reason is None else f"{reason}, not read"


def refused_text(reason: str) -> str:
    """A reason as the refusal of a file someone named: ``"a FIFO, not a regular file: refused"``."""
    if reason in {name for _, name in _KINDS}:
        return f"{reason}, not a regular file: refused"
    return f"{reason}: refused"


def lexically_inside(path: Path, directory: Path) -> bool:
    """Whether absolute ``path``, with ``..`` folded but no symlink followed, names something
    under ``directory`` (as written, or resolved).

    This is where a name *claims* to be; :func:`refused_because` then checks where it leads.
    """
    folded = Path(os.path.normpath(path))
    return any(folded.is_relative_to(d) for d in {Path(os.path.abspath(directory)), directory.resolve()})


def named_file_refusal(path: Path, directory: Path, *, outside: str | None) -> str | None:
    """Why idem may not read ``path`` (absolute, as someone named it) as a drop of
    ``directory``, or ``None`` if it may.

    A name inside the drop directory must lead to a regular file inside it, like a
    file the sensor picks up. A name outside it is refused with the reason
    ``outside`` ("outside the drop directory (drop/feed)"), or, with ``outside=None``
    (``idem ingest``: its user may read any file of their own), must only be a
    regular file. Nothing is opened.

    Raises:
        FileNotFoundError: nothing (or a dangling symlink) is there.
    """
    if lexically_inside(path, directory):
        return refused_because(path, directory.resolve())
    if outside is not None:
        return outside
    return kind_of(path.stat().st_mode)
