"""The two ways ``idem migrate`` fails besides a migration (which raises
:class:`~idem_platform.migrations.MigrationFailed`).

Their own module because the driver (:mod:`.job`, :mod:`.run`), the lock retries
(:mod:`.locks`) and the executors' writer (:mod:`.writer`) all raise or translate
them, and none of those should import another just for a class.
"""

from __future__ import annotations

from idem_platform.errors import TerminalError, TransientError


class MigrateLockTimeout(TransientError):
    """A batch (or the migrate's DDL) kept meeting other sessions' locks past the timeout."""


class MigrateError(TerminalError):
    """An executor's part of the migrate failed for another reason than a migration."""

