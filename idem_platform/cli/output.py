"""What ``idem`` prints: a short summary for a person at a terminal, one JSON line when piped
(or with ``--json``), and one ``idem: error: …`` line on failure.

One place for the three, so every command keeps the same contract: stdout holds only
the report, stderr's last line is the error with or without ``--verbose``, and nothing
printed shows a credential (everything on stderr goes through :func:`scrub`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from typing import Any

from idem_platform.pipeline.retry import human_retry_summary
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.private_files import write_private_text
from idem_platform.redact import scrub
from idem_platform.settings import idem_home, spark_connect_log_level_from_environment


class CommandError(Exception):
    """A failure worth one clear line (exit status 1).

    ``details``: what ``--verbose`` shows under it (a failed run's error with its
    traceback, as Dagster recorded it), when there is more to see.
    """

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


def emit(output: dict[str, Any] | None, json_flag: bool | None) -> int:
    """Print a command's report and return the exit status it asks for (``exit_code``), else 0.

    ``json_flag``: ``None`` for a command without ``--json`` (always JSON). A commit's
    summary (it has ``rows_written``) is shown for people on a terminal unless ``--json``.
    """
    if output is None:
        return 0
    human = json_flag is False and sys.stdout.isatty() and "rows_written" in output
    text = human_summary(output) if human else json.dumps(output, ensure_ascii=False, default=str)
    sys.stdout.write(text + "\n")
    return int(output["exit_code"]) if "exit_code" in output else 0


def terminal(json_flag: bool | None) -> bool:
    """Whether a command that formats its own report writes it for people (a terminal, no ``--json``)."""
    return not json_flag and sys.stdout.isatty()


def progress_line(line: str) -> None:
    """A long command's progress on a terminal: on stderr, so stdout keeps only the report."""
    sys.stderr.write(line + "\n")


def _demo_summary(summary: dict[str, Any]) -> str:
    """``idem demo``'s runs, one summary each, and its push and that push's run."""
    shown = "\n\n".join(f"run {i}: {human_summary(run)}" for i, run in enumerate(summary["runs"], 1))
    push = summary.get("push")
    if push:
        first, again = push["answers"]
        shown += (
            f"\n\npush: {push['request']} with Idempotency-Key {push['idempotency_key']}\n"
            f"  -> {first['status']}, replayed: {str(first['replayed']).lower()}, landed {first['path']} "
            f"({first['lines']} lines, {first['file_key'][:25]}...)\n"
            f"  same key and body again -> {again['status']}, replayed: {str(again['replayed']).lower()}, "
            f"same file key: {str(again['file_key'] == first['file_key']).lower()}\n"
            f"push run: {human_summary(push['run'])}"
        )
    return shown


def human_summary(summary: dict[str, Any]) -> str:
    """A commit's summary for a person at a terminal: what was written where, in how long."""
    if summary.get("runs"):  # the demo: each of its runs
        return _demo_summary(summary)
    if summary.get("retry") is not None:  # idem rejects retry
        return human_retry_summary(summary)
    seconds = float(summary.get("seconds") or 0)
    if summary.get("nothing_to_ingest"):
        return f"nothing to ingest: every partition is committed up to its end ({seconds:.1f} s)"
    if summary.get("already_committed") and not summary.get("commit_id"):
        return f"nothing committed: {summary['already_committed']} ({seconds:.1f} s)"
    if summary.get("replayed"):
        prior = summary.get("prior") or {}
        return (
            f"replay: already committed by {prior.get('commit_id') or prior.get('commit_ids')}; nothing written, "
            f"{summary.get('rows_skipped', 0):,} records skipped ({seconds:.1f} s)"
        )
    rows = [("table", "written", "skipped")]
    for record_type, counts in sorted((summary.get("tables") or {}).items()):
        rows.append((qualified_table_name(record_type), f"{counts.get('written', 0):,}", f"{counts.get('skipped', 0):,}"))
    rows.append(("total", f"{summary.get('rows_written', 0):,}", f"{summary.get('rows_skipped', 0):,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = [f"  {r[0].ljust(widths[0])}  {r[1].rjust(widths[1])}  {r[2].rjust(widths[2])}" for r in rows]
    lines = [f"committed {summary.get('commit_id')} in {seconds:.1f} s", *table]
    for record_type, counts in sorted((summary.get("tables") or {}).items()):
        if "inserted" in counts:  # an upsert table: what its current state became
            lines.append(
                f"  {qualified_table_name(record_type)}_current: {counts['inserted']:,} inserted, {counts.get('updated', 0):,} updated, "
                f"{counts.get('deleted', 0):,} deleted, {counts.get('stale', 0):,} stale (history only)"
            )
    if summary.get("replay_skipped"):
        committed = ", ".join(str(u) for u in summary.get("already_committed") or [])
        lines.append(f"  {summary['replay_skipped']:,} of the skipped are records of files committed before: {committed}")
    if summary.get("tombstones_skipped"):
        lines.append(f"  {summary['tombstones_skipped']:,} of the skipped are Kafka tombstones (expected after Debezium deletes)")
    if summary.get("rows_rejected"):
        lines.append(f"  {summary['rows_rejected']:,} records rejected: idem rejects --commit {summary.get('commit_id')}")
    if summary.get("effects_created"):
        lines.append(f"  {summary['effects_created']:,} outbound effects owed: idem effects deliver")
    if summary.get("effects_suppressed"):
        lines.append(f"  {summary['effects_suppressed']:,} outbound effects suppressed (a replay run)")
    for file in summary.get("files") or []:
        lines.append(f"  file {file.get('file')} ({file.get('lines', 0):,} lines)")
    for offsets in summary.get("offsets") or []:
        lines.append(f"  {offsets['topic']}-{offsets['partition']} offsets [{offsets['from']}, {offsets['to']})")
    return "\n".join(lines)


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback with its whole cause chain, credentials scrubbed."""
    return scrub("".join(traceback.format_exception(exc)))


def unexpected(exc: Exception) -> str:
    """One line for an error nobody foresaw; its traceback goes to a log file the line names."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    try:
        path = idem_home() / "logs" / f"idem-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        write_private_text(path, traceback_text(exc))  # 0600: a traceback can hold records
        return f"{text} (traceback in {path})"
    except OSError:
        return text


def worth_tracing(exc: BaseException) -> str | None:
    """What ``--verbose`` prints above a foreseen error's line: the failed run's recorded
    error, or the traceback when the error was raised from another; else ``None`` (a config
    mistake's line says it all)."""
    details = getattr(exc, "details", None)
    if details:
        return scrub(details.rstrip("\n") + "\n")
    if exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        return traceback_text(exc)
    return None


def fail(line: str, trace: str | None) -> int:
    """Write the traceback (if any), then the one ``idem: error:`` line, last, so that
    ``stderr``'s last line is the error with or without ``--verbose``. Both scrubbed."""
    if trace:
        sys.stderr.write(trace if trace.endswith("\n") else trace + "\n")
    sys.stderr.write(f"idem: error: {scrub(line)}\n")
    return 1


# PySpark's Spark Connect client logs every failed gRPC call here, traceback and all
# (pyspark/sql/connect/logging.py; client/core.py's _handle_rpc_error: "GRPC Error
# received"). PySpark disables the logger unless SPARK_CONNECT_LOG_LEVEL is set, but any
# logging.config.dictConfig(disable_existing_loggers=False) in the process (Dagster's, as
# it loads the instance) enables it again: a dead server then printed 4-14 multi-kB lines
# on stderr before idem's one line, which says the same.
SPARK_CONNECT_LOGGER = "pyspark.sql.connect.logging"


def quiet_spark_connect_client() -> None:
    """Keep the Spark Connect client's gRPC error log off stderr, unless a person asked for
    it with ``SPARK_CONNECT_LOG_LEVEL``: a level above every record it logs survives being
    re-enabled, where ``disabled`` does not."""
    if spark_connect_log_level_from_environment() is None:
        logging.getLogger(SPARK_CONNECT_LOGGER).setLevel(logging.CRITICAL + 1)


def exit_process(code: int) -> None:
    """Leave the process once everything is written.

    With a Spark session open, interpreter teardown finalises thousands of py4j
    proxies, one JVM round trip each (~1 s after a 1M-record ingest; a Connect
    client's gRPC threads are joined too), although the JVM exits by itself when our
    stdin closes. The commit and the Dagster run are already durable in PostgreSQL
    here, so skip the teardown then. The figure this serves: any ``idem ingest``'s wall
    time (a 5-line file's teardown alone cost 0.7 CPU-seconds, ~12 % of its median wall).
    """
    session = sys.modules.get("idem_platform.spark.session")  # never imported: no Spark, plain exit
    if session is None or not session.session_built():
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
