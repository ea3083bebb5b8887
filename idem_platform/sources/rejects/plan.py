"""Plan a retry of a connector's quarantined rejects: which can be retried, as units and slices.

A reject is retried when it is still quarantined (``retried_commit_id`` null), of the
connector (and of one commit, if asked: the rejects it recorded or, for a retry's
commit, those it left quarantined), and complete enough to be the record again:

* its raw text is whole. ``raw`` keeps the first :data:`~idem_platform.coercion.records.RAW_CAP`
  bytes; a longer record (``raw_length`` above the cap, or above the stored text plus
  the line end the text drops) cannot be retried and is reported with its position;
* its position is its unit's prefix and its line (``<sha256[:16]>#L<line>``,
  ``<topic>-<partition>@<offset>``), so the prefix can be given back to the coercion:
  a record without an id then gets the key it would have had (``missing_id: position``);
* a file's line is not blank (a blank line is no record; it cannot be a reject unless
  someone edited it).

A reject an earlier retry tried against the same catalog and rules, with the same
text, and that still failed then (``last_retry_digest``) is left alone: it would fail
again for the same reasons. It is reported as ``unchanged``, with the retry that tried it.

Units: one per original ``(commit, source, position prefix)``, so each record keeps
its position. They all share **one** ledger key, ``rejects:<digest>``, a digest of
the connector's rules, the current catalog, and every selected reject (id and a hash
of its text): a retry of the same rejects against the same catalog is the same
request, so a concurrent twin waits for it and replays it. A new reject, an edited
text or a changed catalog makes another key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from idem_platform.coercion.records import RAW_CAP, RecordSpec
from idem_platform.config import ConnectorConfig
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import SCHEMA
from idem_platform.sources.rejects.reader import RejectsSlice
from idem_platform.sources.rejects.step import RejectsRetried
from idem_platform.write.batch import SourceBatch, Unit

TARGET_SLICES = 8
MIN_SLICE_REJECTS = 5_000
MAX_SLICE_REJECTS = 50_000
SHOWN_POSITIONS = 20
# Python's bytes.isspace(): what makes a line blank for the reader.
_BLANK = " \t\n\r\x0b\x0c"

# The connector's quarantined rejects in scope, each with its position prefix and why it
# cannot be retried (null: it can).
_SCOPE = f"""
WITH scope AS (
    SELECT reject_id, commit_id, source, position, line, raw, raw_length, last_retry_digest, last_retry_commit_id,
           CASE WHEN line >= 0 AND length(position) > length(line::text)
                     AND right(position, length(line::text)) = line::text
                THEN left(position, length(position) - length(line::text)) END AS prefix
    FROM {SCHEMA}.rejects
    WHERE connector = %(connector)s AND retried_commit_id IS NULL
      AND (%(commit)s::uuid IS NULL OR commit_id = %(commit)s::uuid OR last_retry_commit_id = %(commit)s::uuid)
), classified AS (
    SELECT *,
           CASE WHEN prefix IS NULL THEN 'unplaceable'
                WHEN raw_length > %(cap)s OR raw_length > octet_length(raw) + 2 THEN 'truncated'
                WHEN %(lines)s AND btrim(raw, %(blank)s) = '' THEN 'blank'
                WHEN last_retry_digest = md5(%(catalog)s || ':' || md5(raw)) THEN 'unchanged'
           END AS barred
    FROM scope
)
"""

_RUNS = _SCOPE + """
SELECT commit_id::text, source, prefix, min(reject_id), max(reject_id)
FROM (
    SELECT commit_id, source, prefix, reject_id,
           reject_id - row_number() OVER (PARTITION BY commit_id, source, prefix ORDER BY reject_id) AS island
    FROM classified WHERE barred IS NULL
) r
GROUP BY commit_id, source, prefix, island
ORDER BY min(reject_id)
"""

_UNITS = _SCOPE + """
SELECT commit_id::text, source, prefix, count(*), min(line), sum(octet_length(raw))
FROM classified WHERE barred IS NULL
GROUP BY commit_id, source, prefix
"""

_SELECTION = _SCOPE + """
SELECT count(*), md5(string_agg(reject_id::text || ':' || md5(raw), ',' ORDER BY reject_id))
FROM classified WHERE barred IS NULL
"""

_BARRED = _SCOPE + """
SELECT barred, count(*), (array_agg(position ORDER BY reject_id))[1:%(shown)s]
FROM classified WHERE barred IS NOT NULL AND barred <> 'unchanged'
GROUP BY barred
"""

_UNCHANGED = _SCOPE + """
SELECT count(*), array_agg(DISTINCT last_retry_commit_id::text) FILTER (WHERE last_retry_commit_id IS NOT NULL)
FROM classified WHERE barred = 'unchanged'
"""

_ALREADY = f"""
SELECT count(*) FROM {SCHEMA}.rejects
WHERE connector = %(connector)s AND retried_commit_id IS NOT NULL
  AND (%(commit)s::uuid IS NULL OR commit_id = %(commit)s::uuid OR retried_commit_id = %(commit)s::uuid)
"""


@dataclass(frozen=True)
class RetryPlan:
    """A planned retry: the batch to commit and what the selection left out.

    Attributes:
        batch: the units and slices (empty when nothing can be retried).
        key: the retry's ledger key (``None`` when nothing is selected).
        selected: rejects in the batch.
        barred: per reason (``truncated``, ``unplaceable``, ``blank``), how many rejects
            cannot be retried and the first positions.
        already_retried: rejects in scope that earlier retries committed.
        unchanged: rejects left out because an earlier retry tried them against this
            catalog, with this text, and they failed.
        tried_by: the retries' commit ids that tried the ``unchanged`` ones.
    """

    batch: SourceBatch
    key: str | None
    selected: int
    barred: dict[str, dict[str, Any]] = field(default_factory=dict)
    already_retried: int = 0
    unchanged: int = 0
    tried_by: tuple[str, ...] = ()


def _fingerprint(value: Any) -> Any:
    """A JSON-able form of a spec (dataclasses as dicts, sets sorted)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def catalog_fingerprint(spec: RecordSpec) -> str:
    """What decides a record's outcome, as a digest: the catalog and the connector's rules."""
    data = dataclasses.asdict(dataclasses.replace(spec, units=()))
    text = json.dumps(data, sort_keys=True, default=_fingerprint)
    return hashlib.sha256(text.encode()).hexdigest()


def _slices(url: str, units: list[tuple[str, list[tuple[int, int]]]], total: int) -> list[RejectsSlice]:
    """Cut the units' runs into slices of about ``total / TARGET_SLICES`` rejects (bounded);
    a slice may span units, a run may be split."""
    size = min(MAX_SLICE_REJECTS, max(MIN_SLICE_REJECTS, -(-total // TARGET_SLICES)))
    slices: list[RejectsSlice] = []
    current: list[tuple[str, int, int]] = []
    room = size
    for unit_id, runs in units:
        for lo, hi in runs:
            while lo <= hi:
                take = min(room, hi - lo + 1)
                current.append((unit_id, lo, lo + take - 1))
                lo += take
                room -= take
                if room == 0:
                    slices.append(RejectsSlice(url, tuple(current)))
                    current, room = [], size
    if current:
        slices.append(RejectsSlice(url, tuple(current)))
    return slices


def _select(conn: psycopg.Connection, connector: ConnectorConfig, commit_id: str | None, catalog: str) -> dict[str, Any]:
    params = {
        "connector": connector.name,
        "catalog": catalog,
        "commit": commit_id,
        "cap": RAW_CAP,
        "lines": connector.kind != "kafka",
        "blank": _BLANK,
        "shown": SHOWN_POSITIONS,
    }
    return {
        "runs": conn.execute(_RUNS, params).fetchall(),
        "units": conn.execute(_UNITS, params).fetchall(),
        "selection": conn.execute(_SELECTION, params).fetchone(),
        "barred": conn.execute(_BARRED, params).fetchall(),
        "unchanged": conn.execute(_UNCHANGED, params).fetchone(),
        "already": conn.execute(_ALREADY, params).fetchone(),
    }


def plan_retry(
    url: str,
    connector: ConnectorConfig,
    spec: RecordSpec,
    *,
    commit_id: str | None = None,
) -> RetryPlan:
    """The retry of ``connector``'s quarantined rejects (of ``commit_id`` only, if given).

    Args:
        url: PostgreSQL.
        connector: whose rejects; its rules (key namespace, id field, missing_id) are used.
        spec: the record spec of the current catalog (units left out): its digest is
            part of the ledger key.
        commit_id: only the rejects of this commit.
    """
    catalog = catalog_fingerprint(spec)
    with connect(url, application_name="idem-rejects-plan") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # one snapshot for every query
        with conn.transaction():
            found = _select(conn, connector, commit_id, catalog)
    barred = {
        reason: {"count": int(count), "positions": list(positions or [])}
        for reason, count, positions in sorted(found["barred"])
    }
    already = int(found["already"][0])
    unchanged, tried_by = int(found["unchanged"][0]), tuple(sorted(found["unchanged"][1] or ()))
    selected, digest = int(found["selection"][0]), found["selection"][1]
    if not selected:
        empty = SourceBatch(connector=connector.name, kind="rejects", pending=(), slices=(), planned_at=_now())
        return RetryPlan(empty, None, 0, barred, already, unchanged, tried_by)
    key = "rejects:" + hashlib.sha256(f"{connector.name}\n{commit_id or ''}\n{digest}\n{catalog}".encode()).hexdigest()[:32]
    request = {"connector": connector.name, "commit": commit_id, "rejects": selected, "selection": digest, "catalog": catalog}
    runs_of: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for commit, source, prefix, lo, hi in found["runs"]:
        runs_of.setdefault((commit, source, prefix), []).append((int(lo), int(hi)))
    stats = {(commit, source, prefix): (int(n), int(first), int(size)) for commit, source, prefix, n, first, size in found["units"]}
    units: list[Unit] = []
    for group in runs_of:  # in order of their first reject: the order they were recorded
        commit, source, prefix = group
        count, first_line, size = stats[group]
        units.append(
            Unit(
                id=f"{commit}/{source}/{prefix}",
                key=key,
                request=request,
                position_prefix=prefix,
                label=prefix,
                records=count,
                size=size,
                base=first_line,
                location="{label}{offset}",
                source={"key": key, "retry_of": commit, "source": source, "rejects": count},
            )
        )
    runs = [(u.id, runs_of[(u.source["retry_of"], u.source["source"], u.position_prefix)]) for u in units]
    all_runs = tuple(run for _, unit_runs in runs for run in unit_runs)
    batch = SourceBatch(
        connector=connector.name,
        kind="rejects",
        pending=tuple(units),
        slices=tuple(_slices(url, runs, selected)),
        step=RejectsRetried(connector.name, key, all_runs, selected, catalog),
        planned_at=_now(),
    )
    return RetryPlan(batch, key, selected, barred, already, unchanged, tried_by)


def _now() -> str:
    return datetime.now(UTC).isoformat()
