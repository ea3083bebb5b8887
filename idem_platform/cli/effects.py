"""``idem effects``: what the outbox owes (``list``), deliver it (``deliver``), make failed rows
due again (``retry``), forget delivered ones (``purge``). No Dagster, no Spark."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import AT_LEAST_ONE, IdemGroup, invocation, json_option
from idem_platform.cli.output import CommandError, terminal
from idem_platform.config import load_config
from idem_platform.config.effects import EffectConfig
from idem_platform.effects.admin import (
    STATUSES,
    list_outbox,
    outbox_counts,
    purge_delivered,
    retry_failed,
)
from idem_platform.effects.delivery import deliver as deliver_effects
from idem_platform.ledger import DEFAULT_REPLAY_WINDOW
from idem_platform.postgres import connect

_effect = click.option("--effect", metavar="NAME", help="only this effect's rows")


@click.group("effects", cls=IdemGroup)
def effects() -> None:
    """Outbound effects: list, deliver, retry and purge the outbox."""


def _configured(name: str | None) -> list[EffectConfig]:
    """The config's effects (``name``: only that one; a typo is a one-line error naming them)."""
    config = load_config(invocation().config)
    if name is None:
        return list(config.effects)
    chosen = [effect for effect in config.effects if effect.name == name]
    if not chosen:
        known = ", ".join(effect.name for effect in config.effects) or "none"
        raise CommandError(f"no effect named {name!r} in {config.source or 'the config'} (known: {known})")
    return chosen


@effects.command("deliver")
@_effect
@click.option("--wait-seconds", type=float, default=0.0, show_default=True,
              help="keep going while a pending row becomes due within this many seconds (a backoff, a lease)")
@click.option("--limit", type=AT_LEAST_ONE, help="stop after this many attempts")
def deliver(effect: str | None, wait_seconds: float, limit: int | None) -> dict[str, Any]:
    """Send the due outbox rows, each with Idempotency-Key: <its minted key>."""
    started = time.monotonic()
    chosen = _configured(effect)
    url = prepare_environment()
    if not chosen:
        return {"delivered": 0, "retrying": 0, "failed": 0, "attempts": 0, "note": "the config has no effects"}
    report = deliver_effects(url, chosen, wait_seconds=max(wait_seconds, 0.0), limit=limit)
    return {
        "delivered": report.delivered, "retrying": report.retrying, "failed": report.failed,
        "attempts": report.attempts, "lost_claims": report.lost_claims, "effects": report.by_effect,
        "seconds": round(time.monotonic() - started, 3),
    }


@effects.command("list")
@_effect
@click.option("--status", type=click.Choice(STATUSES), help="only rows in this state")
@click.option("--limit", type=AT_LEAST_ONE, help="at most this many rows (default 50)")
@json_option()
def list_command(effect: str | None, status: str | None, limit: int | None) -> None:
    """Per effect, rows pending, delivered and failed; then the rows themselves, oldest first."""
    url = prepare_environment()
    with connect(url) as conn:
        counts = outbox_counts(conn, effect=effect)
        rows = list_outbox(conn, effect=effect, status=status, limit=limit or 50)
    if not terminal(invocation().json):
        sys.stdout.write(json.dumps({"effects": counts, "rows": rows}, ensure_ascii=False, default=str) + "\n")
        return
    for name, entry in counts.items():
        oldest = entry["oldest_pending_seconds"]
        age = f", oldest pending {oldest:.0f}s" if oldest is not None else ""
        sys.stdout.write(f"{name}: {entry['pending']} pending, {entry['delivered']} delivered, {entry['failed']} failed{age}\n")
    for row in rows:
        answer = f"HTTP {row['last_status']}" if row["last_status"] is not None else "-"
        why = f"  {row['reason']}" if row["reason"] else ""
        sys.stdout.write(
            f"  {row['key'][:16]}  {row['effect']}  {row['status']}  tries {row['attempts']}  {answer}  "
            f"{row['record_key']}{why}\n"
        )
    sys.stdout.write(f"{len(rows)} row(s) shown\n")


@effects.command("retry")
@_effect
def retry(effect: str | None) -> dict[str, Any]:
    """Make failed rows pending and due now (their tries count from zero again)."""
    url = prepare_environment()
    with connect(url) as conn, conn.transaction():
        return {"retried": retry_failed(conn, effect=effect)}


@effects.command("purge")
@click.option("--older-than-seconds", type=int, default=int(DEFAULT_REPLAY_WINDOW.total_seconds()), show_default=True,
              help="delete delivered rows delivered longer ago than this (default: the ledger's replay window)")
def purge(older_than_seconds: int) -> dict[str, int]:
    """Delete delivered rows past the ledger's replay window (pending and failed ones stay)."""
    url = prepare_environment()
    with connect(url) as conn, conn.transaction():
        return {"purged": purge_delivered(conn, timedelta(seconds=max(older_than_seconds, 0)))}
