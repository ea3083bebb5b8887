"""``idem``: the command line. On a terminal a short summary for people; piped (or with
``--json``) one JSON line on success; one ``idem: error: …`` line otherwise.

``idem ingest`` runs the very same Dagster job the sensor launches, in process,
against the same instance (``$DAGSTER_HOME``, default ``.idem/dagster`` on the
same PostgreSQL), so CLI runs show up in ``dagster dev`` like any other.

One module per command group; this one holds the root group and :func:`main`, which
turns every outcome into the contract above: Click's own usage errors keep Click's
text and exit status 2, a foreseen failure is one line (exit 1), an unforeseen one is
one line naming a log file with its traceback. Dagster and PySpark are imported only
by the commands that run them, so ``idem --help`` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
import psycopg

# The command modules, not their commands: `idem_platform.cli.offsets` stays the module.
from idem_platform.cli import (
    dev,
    effects,
    ingest,
    ledger,
    migrate,
    offsets,
    read,
    rejects,
    retype,
    serve,
    spark,
)
from idem_platform.cli.options import IdemGroup, Invocation
from idem_platform.cli.output import (
    CommandError,
    emit,
    exit_process,
    fail,
    quiet_spark_connect_client,
    traceback_text,
    unexpected,
    worth_tracing,
)
from idem_platform.errors import IdemError
from idem_platform.private_files import restrict_umask
from idem_platform.redact import remember_url
from idem_platform.settings import postgres_url_from_environment, spark_remote_from_environment


class RootGroup(IdemGroup):
    """The ``idem`` group: commands listed in the order people meet them, and ``promote``
    accepted as the former name of ``retype`` (kept for one release, not listed)."""

    ALIASES = {"promote": "retype"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.ALIASES.get(cmd_name, cmd_name))


@click.group("idem", cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
def idem() -> None:
    """Exactly-once JSON ingestion into PostgreSQL."""


for _command in (
    ingest.ingest, ingest.demo, read.read, ledger.ledger, rejects.rejects, retype.retype, migrate.migrate,
    offsets.offsets, effects.effects, serve.serve, dev.dev, spark.spark,
):
    idem.add_command(_command)


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Run ``idem`` with ``argv`` (default: the process's arguments); return the exit status.

    ``own_process``: the command is the process (the console script), so on failure its
    Spark session is stopped before the error line (:func:`stop_spark_before_failing`).
    """
    remember_url(postgres_url_from_environment())  # no message below may show its password
    remember_url(spark_remote_from_environment())  # nor a Spark Connect server's token
    quiet_spark_connect_client()  # nor PySpark's gRPC error log come before it
    invocation = Invocation()
    try:
        output = _invoke(argv, invocation)
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    except click.ClickException as exc:  # a usage error: Click's usage text, exit status 2
        exc.show()
        return exc.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure is one line (the traceback with --verbose)
        if own_process:
            stop_spark_before_failing()
        return fail(*_failure(exc, verbose=invocation.verbose))
    return emit(output, invocation.json)


def _failure(exc: Exception, *, verbose: bool) -> tuple[str, str | None]:
    """The one error line for ``exc`` and, with ``--verbose``, what to write before it."""
    if isinstance(exc, IdemError | CommandError):
        return str(exc), worth_tracing(exc) if verbose else None
    if isinstance(exc, psycopg.OperationalError):  # PostgreSQL down or unreachable: no bug, one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"PostgreSQL unreachable: {first}", traceback_text(exc) if verbose else None
    return unexpected(exc), traceback_text(exc) if verbose else None  # anything unforeseen


def stop_spark_before_failing() -> None:
    """Stop this process's Spark session, if it built one, so the JVM's last log lines (the
    failed job's other tasks) come before the error line, which stays stderr's last."""
    session = sys.modules.get("idem_platform.spark.session")  # never imported: no Spark to stop
    if session is not None:
        session.stop_built_session()


def _invoke(argv: Sequence[str] | None, invocation: Invocation) -> Any:
    """Parse ``argv`` and run the command; its report (a dict) or ``None``."""
    args = list(argv) if argv is not None else sys.argv[1:]
    with idem.make_context("idem", args, obj=invocation) as ctx:
        return idem.invoke(ctx)


def run() -> None:
    """The ``idem`` console script (and ``python -m idem_platform.cli``): files it and the
    processes it starts create are their owner's only (:func:`restrict_umask`)."""
    restrict_umask()
    exit_process(main(own_process=True))
