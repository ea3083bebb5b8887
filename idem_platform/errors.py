"""Error classes shared by every layer.

Errors carry structured attributes so the CLI, the Dagster layer and tests can
tell *what* failed without parsing messages. ``TransientError`` marks failures
worth retrying (a lost connection, a dead executor); ``TerminalError`` marks
failures that would fail again on the same input (a config error, a batch over
its reject ratio).
"""

from __future__ import annotations

from typing import Any


class IdemError(Exception):
    """Base class of every error raised on purpose by idem_platform."""

    retryable: bool = False

    def to_json(self) -> dict[str, Any]:
        """The error as stored in the ledger and shown in summaries."""
        return {"class": type(self).__name__, "message": str(self), "retryable": self.retryable}

    @staticmethod
    def from_json(data: dict[str, Any]) -> IdemError:
        """Rebuild an error another process reported as JSON: same class (by name), same message.

        An unknown class becomes a generic terminal or transient error that
        keeps the message.
        """
        known: dict[str, type[IdemError]] = {}
        stack: list[type[IdemError]] = [IdemError]
        while stack:
            cls = stack.pop()
            known[cls.__name__] = cls
            stack.extend(cls.__subclasses__())
        fallback = TransientError if data.get("retryable") else TerminalError
        chosen = known.get(str(data.get("class")), fallback)
        error = chosen.__new__(chosen)
        Exception.__init__(error, str(data.get("message", "")))
        return error


class TerminalError(IdemError):
    """Fails the same way on every retry of the same input."""

    retryable = False


class TransientError(IdemError):
    """May succeed when retried (infrastructure, not data)."""

    retryable = True


class ConfigError(TerminalError):
    """``idem.yaml`` (or its code equivalent) is invalid.

    Attributes:
        path: the config file, when known.
        key: the dotted key that is wrong, e.g. ``connectors[0].name``.
    """

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        self.path = path
        self.key = key
        where = ": ".join(part for part in (path, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class KeyValidationError(TerminalError):
    """A caller-supplied idempotency key is invalid (HTTP 400)."""


class RejectRatioExceeded(TerminalError):
    """A batch's reject ratio is above the connector's ``max_reject_ratio``."""

    def __init__(self, message: str, *, rejected: int, total: int, reasons: list[str]) -> None:
        self.rejected = rejected
        self.total = total
        self.reasons = reasons
        super().__init__(message)


class FileChangedError(TransientError):
    """A dropped file changed between hashing and reading; nothing was committed."""


class RefusedFileError(TerminalError):
    """A named file may not be read: not a regular file (a FIFO would block the reader),
    or outside its drop directory."""


class InFlightError(TransientError):
    """Another live run is ingesting the same file right now."""


class EmbeddedPostgresError(TerminalError):
    """The embedded PostgreSQL cannot serve this setup (e.g. a cluster master)."""



class SourceMoved(TerminalError):
    """A source's committed position moved under this commit (another run committed the
    range first): this run commits nothing."""


class KafkaError(TransientError):
    """A Kafka broker could not be reached or refused a request (retried later)."""


class OffsetGapError(TerminalError):
    """Committed offsets point below a partition's log start: retention deleted messages
    before they were ingested, and the connector's ``offset_gap`` policy is ``fail``."""
