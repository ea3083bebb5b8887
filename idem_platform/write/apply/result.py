"""What a commit returns and records: its result, the ``commits`` row, the
``execution_log`` counts, what each ledger row keeps, and a replay's own commit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from idem_platform.ledger import Ledger
from idem_platform.postgres.schema import SCHEMA
from idem_platform.write.plan import CommitPlan


def sources_of(sources: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A result's ``files`` (the units that are files, the summary's contract key) and,
    when other sources took part, all of them under ``sources``."""
    files = [source for source in sources if "file" in source]
    return {"files": files} if len(files) == len(sources) else {"files": files, "sources": sources}


def applied_result(
    plan: CommitPlan,
    *,
    rows_written: int,
    idempotent_skips: int,
    rows_rejected: int,
    tables: dict[str, Any],
    timings: dict[str, Any],
    units: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The result of a commit that applied its rows: the run's summary, and what the
    ``commits`` row and the ledger rows record of it.

    ``units``: each unit's own counts, in plan order (:func:`~idem_platform.write.apply.units.unit_counts`),
    added to its entry in ``files``/``sources``, so each ledger row keeps its own
    file's figures beside the commit's.
    """
    sources = plan.sources() if units is None else [{**s, **c} for s, c in zip(plan.sources(), units, strict=True)]
    return {
        "commit_id": plan.commit_id,
        "connector": plan.connector,
        "run_id": plan.run_id,
        "rows_written": rows_written,
        "rows_skipped": idempotent_skips + plan.replayed_records,
        "rows_rejected": rows_rejected,
        "replayed": False,
        **({"replay_skipped": plan.replayed_records} if plan.replayed_records else {}),
        **sources_of(sources),
        "tables": tables,
        "schema_versions": {rt: plan.tables[rt].schema_version for rt in sorted(plan.tables)},
        "timings": timings,
    }


def record_applied(
    conn: psycopg.Connection,
    plan: CommitPlan,
    result: dict[str, Any],
    *,
    counts: tuple[int, int, int],
    valid_through: datetime | None,
) -> None:
    """Record an applied commit in the transaction that holds its rows: the ``commits``
    row, the ``execution_log`` counts (``counts``: rows written, idempotent skips, rows
    rejected) and each ledger row's result (committed)."""
    rows_written, idempotent_skips, rows_rejected = counts
    record_commit(conn, plan, result, replay=False, valid_through=valid_through)
    log_counts(conn, plan.commit_id, rows_written, idempotent_skips, rows_rejected, replay=plan.replay,
               replay_skipped=plan.replayed_records)
    log_upsert_counts(conn, plan.commit_id, result.get("tables") or {})
    ledger = Ledger(conn, plan.connector, replay_window=timedelta(seconds=plan.replay_window_seconds))
    keys = plan.ledger_keys()
    for key in keys:
        ledger.commit(key, ledger_result(result, key, len(keys)), owner=plan.owner)


def ledger_result(result: dict[str, Any], key: str, commit_keys: int) -> dict[str, Any]:
    """What one ledger row keeps of its commit's result: the counts and tables of the
    commit, but of its sources only this key's own, plus how many keys the commit had.

    A batch of N files writes N ledger rows in its applying transaction; with every
    source in each, that was N² entries (500 files: 250,000, ~40 MB of jsonb). The whole
    list stays once in ``idem.commits.sources``; ``commit_keys`` is enough to tell
    whether a replay covers all of a prior commit (:func:`~idem_platform.pipeline.commit.replayed_records`).
    """
    own = {name: [s for s in entries if s.get("key") == key] for name in ("files", "sources") if (entries := result.get(name)) is not None}
    return {**result, **own, "commit_keys": commit_keys}


def own_counts(result: dict[str, Any], key: str) -> tuple[int, int, int] | None:
    """``(written, skipped, rejected)`` of the unit ``key`` in a commit's result (its ledger
    row's), or ``None`` when that commit kept no per-unit counts (before they were kept)."""
    for name in ("files", "sources"):
        for entry in result.get(name) or []:
            if entry.get("key") == key and "rows_skipped" in entry:
                return int(entry["rows_written"]), int(entry["rows_skipped"]), int(entry["rows_rejected"])
    return None


def record_commit(
    conn: psycopg.Connection,
    plan: CommitPlan,
    result: dict[str, Any],
    *,
    replay: bool,
    valid_through: datetime | None = None,
) -> None:
    """The ``commits`` row. ``valid_through``: the source's own clock when it has one
    (the Kafka messages' timestamps), else the end of the replay window."""
    conn.execute(
        f"""
        INSERT INTO {SCHEMA}.commits (commit_id, run_id, connector, started_at, rows_written,
            rows_skipped, rows_rejected, replay, sources, valid_through, schema_versions, tables)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, coalesce(%s, now() + %s), %s, %s)
        """,
        [
            result["commit_id"], plan.run_id, plan.connector, plan.started_at,
            result["rows_written"], result["rows_skipped"], result["rows_rejected"], replay,
            Jsonb(plan.sources()), valid_through, timedelta(seconds=plan.replay_window_seconds),
            Jsonb(result.get("schema_versions", {})), Jsonb(result.get("tables", {})),
        ],
    )


def log_counts(
    conn: psycopg.Connection,
    commit_id: str,
    written: int,
    skipped: int,
    rejected: int,
    *,
    replay: bool,
    replay_skipped: int = 0,
) -> None:
    """The commit's ``execution_log`` counts. ``replay_skipped``: records of units an
    earlier commit holds (a mixed batch's already-committed files)."""
    events = {
        "written": written,
        "replay_skip" if replay else "idempotent_skip": skipped,
        "rejected": rejected,
    }
    if replay_skipped:
        events["replay_skip"] = events.get("replay_skip", 0) + replay_skipped
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {SCHEMA}.execution_log (commit_id, event_type, count) VALUES (%s, %s, %s)",
            [(commit_id, event, count) for event, count in events.items() if count],
        )


UPSERT_COUNTS = ("inserted", "updated", "deleted", "stale")


def log_upsert_counts(conn: psycopg.Connection, commit_id: str, tables: dict[str, Any]) -> None:
    """The ``execution_log`` rows of what the commit's versions did to its upsert tables'
    current state (``upsert_inserted``…, summed over those tables; a split of ``written``)."""
    totals = {name: sum(int(t.get(name) or 0) for t in tables.values()) for name in UPSERT_COUNTS}
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {SCHEMA}.execution_log (commit_id, event_type, count) VALUES (%s, %s, %s)",
            [(commit_id, f"upsert_{name}", count) for name, count in totals.items() if count],
        )


def record_replay(conn: psycopg.Connection, plan: CommitPlan, priors: list[dict[str, Any]]) -> dict[str, Any]:
    """Record a run whose units were all committed before: a ``replay`` commit, nothing else.

    Every record of the units counts as ``replay_skip`` (each unit's own records when its
    ledger row kept them); ``prior`` carries the original commits' counts. Runs in its own transaction.
    """
    owns = {unit.key: own_counts(prior, unit.key) for unit, prior in zip(plan.units, priors, strict=True)}
    if owns and all(own is not None for own in owns.values()):  # each unit's own records, as counted then
        skipped = sum(sum(own) for own in owns.values() if own is not None)
    else:  # ledger rows from before units kept their own counts: the prior commits' totals
        skipped = sum(p.get("rows_written", 0) + p.get("rows_skipped", 0) + p.get("rows_rejected", 0) for p in _unique(priors))
    result = {
        "commit_id": plan.commit_id,
        "connector": plan.connector,
        "run_id": plan.run_id,
        "rows_written": 0,
        "rows_skipped": skipped,
        "rows_rejected": 0,
        "replayed": True,
        **sources_of(plan.sources()),
        "prior": _prior(priors),
    }
    with conn.transaction():
        record_commit(conn, plan, result, replay=True)
        log_counts(conn, plan.commit_id, 0, skipped, 0, replay=True)
    return result


def _unique(priors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for prior in priors:
        seen.setdefault(str(prior.get("commit_id")), prior)
    return list(seen.values())


def _prior(priors: list[dict[str, Any]]) -> dict[str, Any]:
    unique = _unique(priors)
    if len(unique) == 1:
        p = unique[0]
        return {k: p.get(k) for k in ("commit_id", "rows_written", "rows_skipped", "rows_rejected")}
    return {
        "commit_ids": [p.get("commit_id") for p in unique],
        **{k: sum(p.get(k, 0) for p in unique) for k in ("rows_written", "rows_skipped", "rows_rejected")},
    }
