"""The retry's commit step: mark the rejects retried, inside the applying transaction.

``apply`` takes every planned reject with a compare-and-set, ``WHERE
retried_commit_id IS NULL``, after locking the rows in id order: of two retries
that planned the same rows, exactly one takes them; the other's transaction rolls
back with its rows (:class:`~idem_platform.errors.SourceMoved`). Then, instead of
inserting the batch's rejects as new rows, :meth:`RejectsRetried.record_rejects`
hands the rows that still fail back to the quarantine (``retried_commit_id`` null
again) with the reasons they fail for now (``last_retry_reasons``). Both happen in
the transaction that writes the rows, the ``commits`` row and the ledger, so a
reject is marked retried exactly when its row is committed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import sql

from idem_platform.coercion.records import LINE_BITS, LINE_MASK
from idem_platform.errors import SourceMoved
from idem_platform.postgres.schema import SCHEMA

if TYPE_CHECKING:
    import psycopg

    from idem_platform.write.plan import CommitPlan


@dataclass(frozen=True)
class RejectsRetried:
    """Mark the planned rejects retried (all of them; those that fail again go back).

    Attributes:
        connector: whose rejects.
        key: the retry's ledger key (one for the whole selection).
        runs: ``(lo, hi)`` runs of the planned reject ids, inclusive.
        planned: how many rejects the runs hold.
        catalog: digest of the catalog and rules the rejects are tried against: a reject
            that still fails keeps ``md5(catalog:md5(raw))`` in ``last_retry_digest``, so
            later retries leave it alone until the catalog or its text changes.
    """

    connector: str
    key: str
    runs: tuple[tuple[int, int], ...]
    planned: int
    catalog: str = ""

    def restricted_to(self, unit_keys: Collection[str]) -> RejectsRetried | None:
        return self if self.key in unit_keys else None

    def _bounds(self) -> tuple[list[int], list[int]]:
        return [lo for lo, _ in self.runs], [hi for _, hi in self.runs]

    def apply(self, conn: psycopg.Connection, commit_id: str, max_timestamps: Mapping[str, int]) -> dict[str, Any]:
        """Take every planned reject for this commit.

        Raises:
            SourceMoved: another retry took some of them first; nothing commits.
        """
        los, his = self._bounds()
        # Row locks in id order: two retries over overlapping rows queue instead of deadlocking.
        conn.execute(
            f"SELECT r.reject_id FROM {SCHEMA}.rejects r "
            "JOIN unnest(%s::bigint[], %s::bigint[]) AS g(lo, hi) ON r.reject_id BETWEEN g.lo AND g.hi "
            "ORDER BY r.reject_id FOR UPDATE OF r",
            [los, his],
        )
        taken = conn.execute(
            f"UPDATE {SCHEMA}.rejects r SET retried_commit_id = %s::uuid, retried_at = now(), "
            "retries = r.retries + 1, last_retry_commit_id = %s::uuid, last_retried_at = now(), "
            "last_retry_reasons = NULL, last_retry_digest = NULL "
            "FROM unnest(%s::bigint[], %s::bigint[]) AS g(lo, hi) "
            "WHERE r.reject_id BETWEEN g.lo AND g.hi AND r.retried_commit_id IS NULL AND r.connector = %s",
            [commit_id, commit_id, los, his, self.connector],
        ).rowcount
        if taken != self.planned:
            raise SourceMoved(
                f"{self.planned - taken} of the {self.planned} rejects this retry planned were retried by "
                "another run meanwhile (or are gone); nothing was committed"
            )
        return {"rejects_taken": taken}

    def record_rejects(self, conn: psycopg.Connection, plan: CommitPlan, stages: Sequence[sql.Composable]) -> int:
        """Instead of new ``idem.rejects`` rows: give the records that still fail back to the
        quarantine, with their new reasons. Returns how many (the batch's rejects).

        A staged reject is found by its unit (original commit and source) and line, among
        the rows this commit took in :meth:`apply`.
        """
        if not stages:
            return 0
        union = sql.SQL(" UNION ALL ").join(sql.SQL("SELECT _pos, _errors FROM {}").format(t) for t in stages)
        statement = sql.SQL(
            "UPDATE {rejects} r SET retried_commit_id = NULL, retried_at = NULL, last_retry_reasons = x.errors, "
            "last_retry_digest = md5(%(catalog)s || ':' || md5(r.raw)) "
            "FROM (SELECT f.commit_id, f.source, f.base + (s._pos & {mask}) AS line, s._errors AS errors "
            "FROM ({union}) s JOIN unnest(%(idx)s::int[], %(commits)s::uuid[], %(sources)s::text[], %(bases)s::bigint[]) "
            "AS f(idx, commit_id, source, base) ON f.idx = (s._pos >> {bits})) x "
            "WHERE r.retried_commit_id = %(commit_id)s::uuid AND r.commit_id = x.commit_id "
            "AND r.source = x.source AND r.line = x.line"
        ).format(
            rejects=sql.SQL(f"{SCHEMA}.rejects"),
            mask=sql.Literal(LINE_MASK),
            bits=sql.Literal(LINE_BITS),
            union=union,
        )
        params = {
            "commit_id": plan.commit_id,
            "catalog": self.catalog,
            "idx": list(range(len(plan.units))),
            "commits": [unit.source["retry_of"] for unit in plan.units],
            "sources": [unit.source["source"] for unit in plan.units],
            "bases": [unit.base for unit in plan.units],
        }
        return int(conn.execute(statement, params).rowcount)

    def after_commit(self, result: dict[str, Any]) -> dict[str, Any]:
        return {}
