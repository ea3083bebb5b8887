"""The logger ``idem ingest`` and ``idem demo`` run their jobs with: what a person at a terminal reads.

Dagster's console logger prints every framework event, and a failed step's
whole traceback (a hundred lines) before ``idem: error:`` says the same in one.
This logger prints only what the job's own code says (progress, the commit's
counts) and leaves failures to the CLI's one line; the run's full event log,
tracebacks included, is still in the instance for ``dagster dev``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import dagster as dg

from idem_platform.redact import scrub


class _OwnMessages(logging.Handler):
    """Writes ``<step>: <message>`` for messages the job's code logged, nothing else."""

    def emit(self, record: logging.LogRecord) -> None:
        meta: dict[str, Any] = getattr(record, "dagster_meta", None) or {}
        if meta.get("dagster_event") is not None or not logging.INFO <= record.levelno < logging.ERROR:
            # Errors are the run failing (Dagster's "Dependencies for step ... failed. Not
            # executing." for each step after the failed one): the CLI says that in one line.
            return
        message = scrub(meta.get("orig_message") or record.getMessage())
        step = meta.get("step_key")
        sys.stderr.write(f"{step}: {message}\n" if step else f"{message}\n")


# config_schema=None is the default, spelled out: dagster's typed overloads of @logger
# take config_schema without a default.
@dg.logger(
    config_schema=None,
    description="Only the job's own messages (progress, counts), one line each; no framework events.",
)
def terminal_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    logger = logging.getLogger("idem.terminal")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not any(isinstance(h, _OwnMessages) for h in logger.handlers):
        logger.addHandler(_OwnMessages())
    return logger
