"""``idem rejects``: list the quarantined records (``list``, the default), or commit those the
current catalog accepts (``retry``).

A group, so that ``idem rejects retry --help`` describes the retry. The group takes the
list's options itself, so ``idem rejects --commit ID`` lists as it always did, and an
option given before ``list``/``retry`` counts for it (``idem rejects --connector feed
retry``). The retry runs a Dagster job: Dagster is imported when it runs, so ``idem
--help`` stays fast.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from idem_platform.cli.common import choose_connector, known_connector, prepare_environment
from idem_platform.cli.options import AT_LEAST_ONE, COMMIT_ID, IdemGroup, invocation, json_option
from idem_platform.cli.output import CommandError, terminal
from idem_platform.config import load_config
from idem_platform.postgres import connect
from idem_platform.settings import dagster_url_from_environment
from idem_platform.sources.rejects.listing import list_rejects

_connector = click.option("--connector", metavar="NAME", help="only this connector's rejects")
_commit = click.option("--commit", type=COMMIT_ID, help="only the rejects of this commit id")
_limit = click.option("--limit", type=AT_LEAST_ONE, help="at most this many (default 50)")
_dry_run = click.option("--dry-run", is_flag=True, help="retry: count what would pass now, commit nothing")
_json = json_option("JSON lines even on a terminal")


@click.group("rejects", cls=IdemGroup, invoke_without_command=True, short_help="List rejects, or retry them.")
@_connector
@_commit
@_dry_run
@_limit
@_json
@click.pass_context
def rejects(ctx: click.Context, connector: str | None, commit: str | None, dry_run: bool, limit: int | None) -> None:
    """List rejected records with their positions and reasons (the default: `list`);
    `retry` commits those the current catalog accepts."""
    if ctx.invoked_subcommand is None:
        if dry_run:
            raise CommandError("--dry-run goes with idem rejects retry")
        print_rejects(connector, commit, limit or 50)


def _given(ctx: click.Context, name: str, value: Any) -> Any:
    """An option of ``list``/``retry``, else the same option given before the subcommand's name."""
    if value is not None and value is not False:
        return value
    return ctx.parent.params.get(name) if ctx.parent is not None else None


@rejects.command("list")
@_connector
@_commit
@_limit
@_json
@click.pass_context
def list_command(ctx: click.Context, connector: str | None, commit: str | None, limit: int | None) -> None:
    """List rejected records, newest first: position, every reason, the raw text, and what
    retries did."""
    if ctx.parent is not None and ctx.parent.params.get("dry_run"):
        raise CommandError("--dry-run goes with idem rejects retry")
    print_rejects(_given(ctx, "connector", connector), _given(ctx, "commit", commit), _given(ctx, "limit", limit) or 50)


@rejects.command("retry")
@_connector
@_commit
@_dry_run
@click.option(
    "--dagster", "dagster_url", metavar="URL",
    help="launch the run through this Dagster webserver and wait for it [default: $IDEM_DAGSTER_URL; unset: in process]",
)
@_json
@click.pass_context
def retry(ctx: click.Context, connector: str | None, commit: str | None, dry_run: bool, dagster_url: str | None) -> dict[str, Any]:
    """Re-run the quarantined rejects (one commit's with --commit) through the current
    catalog, commit those that pass; those that still fail stay quarantined."""
    # Late import (pulls in Dagster and PySpark): kept off idem --help's imports.
    from idem_platform.defs.inprocess import run_retry_job
    from idem_platform.defs.remote import launch_retry_job

    started = time.monotonic()
    commit = _given(ctx, "commit", commit)
    url = prepare_environment()
    config = load_config(invocation().config)
    name = _given(ctx, "connector", connector)
    if name is None and commit is not None and len(config.connectors) > 1:
        name = _connector_of_commit(url, commit)
    chosen = config.connector(choose_connector(config, name))
    dry = bool(_given(ctx, "dry_run", dry_run))
    remote = dagster_url or dagster_url_from_environment()
    if remote is None:
        summary = run_retry_job(config, chosen, commit=commit, dry_run=dry)
    else:
        summary = launch_retry_job(remote, chosen, commit=commit, dry_run=dry)
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def print_rejects(connector: str | None, commit: str | None, limit: int) -> None:
    """The rejects as JSON lines (piped, or ``--json``), or for people on a terminal."""
    url = prepare_environment()
    if connector is not None:
        connector = known_connector(load_config(invocation().config), url, connector)
    with connect(url) as conn:
        found = list_rejects(conn, connector=connector, commit_id=commit, limit=limit)
    if not terminal(invocation().json):
        for reject in found:
            sys.stdout.write(json.dumps(reject, ensure_ascii=False, default=str) + "\n")
        return
    for reject in found:
        reasons = "; ".join(
            f"{r.get('field') + ': ' if r.get('field') else ''}{r['message']} [{r['rule']}]" for r in reject["reasons"]
        )
        sys.stdout.write(f"{reject['connector']}  {reject['position']}  {reasons}{_retry_note(reject)}\n    {reject['raw'][:160]}\n")
    sys.stdout.write(f"{len(found)} reject(s) shown\n")


def _retry_note(reject: dict[str, Any]) -> str:
    """What the quarantine loop did with a reject, for the listing on a terminal."""
    if reject.get("retried_commit_id"):
        return f"  [retried: committed by {reject['retried_commit_id']}]"
    if reject.get("last_retry_reasons"):
        now = "; ".join(str(r.get("message")) for r in reject["last_retry_reasons"])
        return f"  [still failing after {reject.get('retries') or 0} retr{'y' if reject.get('retries') == 1 else 'ies'}: {now}]"
    return ""


def _connector_of_commit(url: str, commit: str) -> str | None:
    """The connector whose rejects ``commit`` recorded (or, a retry's, left quarantined), if any."""
    with connect(url) as conn:
        row = conn.execute(
            "SELECT connector FROM idem.rejects WHERE commit_id = %s::uuid OR last_retry_commit_id = %s::uuid LIMIT 1",
            [commit, commit],
        ).fetchone()
    return None if row is None else str(row[0])
