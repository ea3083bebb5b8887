"""Which staged attempt of each slice is applied, and the staging tables it leaves.

Spark may run a slice's task more than once (a retry, a speculative copy), and each
attempt stages into tables of its own. Only the attempt whose commit message reached
the driver first counts: its rows are applied and its rejects recorded; the tables of
the others are never read and are dropped after COMMIT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg import sql

from idem_platform.errors import TransientError
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import attempt_table, staged_ident


@dataclass(frozen=True)
class StagedAttempt:
    """What one task attempt staged, as reported by its commit message."""

    partition: int
    attempt: str
    rows: dict[str, int] = field(default_factory=dict)
    with_extra: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    repeats: dict[str, int] = field(default_factory=dict)  # repeats counted, not staged
    tombstones: int = 0  # of repeats: a Debezium feed's Kafka tombstones (messages without a value)
    known: dict[str, int] = field(default_factory=dict)  # keys the table already held: counted as skips, not staged
    unique_keys: bool = False  # the attempt staged no key twice (no DISTINCT ON needed)
    max_timestamps: dict[int, int] = field(default_factory=dict)  # unit index -> newest source timestamp (ms)
    props_fields: dict[str, list[str]] = field(default_factory=dict)  # record type -> fields coercion put in props
    # unit index -> records read (a file's blank lines are no records); None: not counted
    # (an attempt made by hand), and then the commit reports no per-unit figures.
    records: dict[int, int] | None = None


def accepted_attempts(plan: CommitPlan, messages: list[StagedAttempt | None]) -> list[StagedAttempt]:
    """One attempt per input partition: the one whose message reached the driver first.

    Raises:
        TransientError: a partition has no message (its rows would be lost).
    """
    chosen: dict[int, StagedAttempt] = {}
    for message in messages:
        if message is not None and message.partition not in chosen:
            chosen[message.partition] = message
    missing = set(range(plan.input_partitions)) - set(chosen)
    if missing:
        raise TransientError(
            f"commit messages cover {len(chosen)} of {plan.input_partitions} partitions "
            f"(missing {sorted(missing)[:5]}); nothing was committed"
        )
    return [chosen[p] for p in sorted(chosen)]


def rejects_tables(plan: CommitPlan, chosen: list[StagedAttempt]) -> list[sql.Composed]:
    """The accepted attempts' reject tables (an attempt with no reject created none)."""
    return [staged_ident(attempt_table(plan.rejects_table, a.attempt)) for a in chosen if a.rejected]


def accepted_tables(plan: CommitPlan, chosen: list[StagedAttempt]) -> list[str]:
    """The staging tables the accepted attempts wrote (rows per record type, rejects),
    dropped inside the applying transaction: nothing else can be writing to them."""
    names = []
    for message in chosen:
        names += [attempt_table(plan.staging_table(rt), message.attempt) for rt, n in message.rows.items() if n]
        if message.rejected:
            names.append(attempt_table(plan.rejects_table, message.attempt))
    return names
