"""Files and directories only their owner can read: what idem writes under its home and landing dirs.

Pushed bodies, their spools, tracebacks in ``.idem/logs`` can hold records, tokens
in a failed URL, personal data. Under the usual umask 022 Python's ``open`` and
``mkdir`` make them world-readable (0644, 0755); these helpers give 0600 files and
0700 directories whatever the umask. A directory that already exists is left with
the mode its owner gave it: it may be shared on purpose.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700
PROCESS_UMASK = 0o077  # what idem's own processes create: no group or other bits


def restrict_umask() -> None:
    """Give this process (and every process it starts) the umask 077, once, at the start of
    ``idem`` (:func:`idem_platform.cli.run`: every command, ``idem dev`` and ``idem serve``
    included).

    The helpers below cover the files idem writes itself, but not those its libraries
    write for it with the process's umask: Dagster's compute logs (a run's stdout and
    stderr, tracebacks and records in them), its SQLite storage and run workspaces, Spark's
    scratch files, the daemon's and the webserver's files under ``idem dev``. Under the
    usual umask 022 those were world-readable. A umask is the one setting every one of
    them obeys; it is set here and nowhere else (a library must not change its host's).
    """
    os.umask(PROCESS_UMASK)


def private_dir(path: Path) -> Path:
    """``mkdir -p path``, each directory it creates 0700 (``mkdir(parents=True)`` gives the
    parents the umask's mode, 0755 usually); returns ``path``."""
    missing: list[Path] = []
    here = path
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made by someone else meanwhile: theirs to mode
            continue
        os.chmod(directory, DIR_MODE)  # mkdir's mode is masked by the umask
    return path


def create_private(path: Path) -> BinaryIO:
    """A new file at ``path`` (which must not exist), 0600, open for binary writing."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)  # os.open's mode is masked by the umask
    return os.fdopen(descriptor, "wb")


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, creating or truncating it; the file ends up 0600
    even when it existed with another mode."""
    private_dir(path.parent)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(text.encode("utf-8"))
