"""The dispatcher: claim a due outbox row, send it under its minted key, record the answer.

At least once, acted on once: a row is sent until the receiver answers 2xx, always with
``Idempotency-Key: <its key>``, so a receiver that keeps the keys it acted on acts once
however often it is sent the row (after a timeout whose request did arrive, after a
dispatcher died between "sent" and "recorded").

**Claims.** One row at a time, in a short transaction: ``FOR UPDATE SKIP LOCKED`` (two
dispatchers never wait on each other nor take the same row) and a lease
(``claimed_until = now() + lease_seconds``). A row whose lease ran out is due again: a
dispatcher killed mid-request leaves its row to the next one once the lease ends, and
never more than that row. The claim counts the attempt, so a row whose sending kills its
dispatcher every time still ends, parked after ``max_attempts``. The answer is recorded
only while the lease is still this dispatcher's (``claimed_by``).

**Statistics.** The claim reads the first due row from an index in its order only while the
planner knows how many rows are pending: a dispatcher analyzes the outbox itself when it
changed a lot since its last ANALYZE (:func:`refresh_statistics`), not waiting for autovacuum.

**Order.** The rows of one identity (effect, record type, external id) go in commit order
(``seq``): a row is claimable only while no earlier row of its identity is pending and no
other row of it is claimed, so a later version waits for the earlier one's delivery and two
dispatchers never send two versions at once. A parked (``failed``) row is not pending: it
does not hold the later ones back. Its status only leaves ``pending`` for good, so the
test cannot pass early.

**Results.** An effect with ``results_table`` writes the answer (:mod:`.results`) in the
transaction that marks the row delivered: a result exists if and only if its delivery is
recorded.

**Answers.** 2xx: delivered. A connection error, a timeout, 409 (the receiver holds the
key in flight), 429 and 5xx are transient: due again after ``Retry-After`` seconds when the
receiver says so, else after an exponential backoff with jitter, until ``max_attempts``
tries in all. Any other status (a 4xx, a redirect: never followed) is permanent. A row
parked as ``failed`` keeps the reason; ``idem effects retry`` makes it due again.

**Connections.** One ``deliver`` call keeps a connection per receiver open while the receiver
keeps it (:mod:`.connections`); a request through a proxy goes through urllib.

**Functions.** A ``python:`` effect calls ``function(payload, key)`` through
:func:`~idem_platform.idempotency.run_idempotently` in the ledger namespace
``effects.<effect>`` under the minted key: its JSON result is recorded in the ledger in
the transaction that ends the call, before the outbox row is marked delivered. A
dispatcher that dies between the two leaves a row whose next claim *replays* the recorded
result instead of calling the function again. One that dies while the function runs rolls
the claim back with it: the function runs again (writes it made through ``conn`` are rolled
back too; anything else it did must be idempotent by ``key``). A raised exception is
released, not recorded, and retried like a transient answer until ``max_attempts``.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from http.client import HTTPException
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from idem_platform.config.effects import MAX_RESPONSE_CHARS, EffectConfig
from idem_platform.effects.connections import Connections, direct
from idem_platform.effects.results import (
    MAX_RESULT_BYTES,
    as_json,
    ensure_results_tables,
    results_ident,
)
from idem_platform.faults import checkpoint
from idem_platform.idempotency import run_idempotently
from idem_platform.postgres.connection import connect
from idem_platform.redact import scrub

USER_AGENT = "idem-effects"  # unless an effect's headers name another
EFFECTS_NAMESPACE = "effects"  # a function effect's ledger rows: effects.<effect name>
# How long a function's recorded result is kept for a replay: as long as a row may stay owed
# (a week of retries and parking), not the ledger's one-day default.
FUNCTION_REPLAY_WINDOW = timedelta(days=30)

_CLAIM = """
WITH due AS (
    SELECT o.key FROM idem.outbox o
    WHERE o.status = 'pending' AND o.effect = ANY(%(effects)s) AND o.next_attempt_at <= now()
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      AND NOT EXISTS (
          SELECT 1 FROM idem.outbox e
          WHERE e.effect = o.effect AND e.record_type = o.record_type AND e.external_id = o.external_id
            AND e.status = 'pending' AND e.key <> o.key AND (e.seq < o.seq OR e.claimed_until >= now())
      )
    ORDER BY o.next_attempt_at, o.seq
    LIMIT 1
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE idem.outbox o
SET claimed_by = %(worker)s, claimed_until = now() + make_interval(secs => l.lease), attempts = o.attempts + 1,
    last_attempt_at = now()
FROM due, unnest(%(effects)s::text[], %(leases)s::float8[]) AS l(effect, lease)
WHERE o.key = due.key AND l.effect = o.effect
RETURNING o.key, o.effect, o.payload, o.attempts
"""

# The claim's plan rests on the outbox's planner statistics. A commit that writes thousands of
# outbox rows into an outbox PostgreSQL never analyzed, or last analyzed when it was empty or held
# only delivered rows, leaves the planner believing a handful of rows are pending: it then walks and sorts every
# pending row on each claim (about 100 ms a claim at 10,000 pending rows instead of 0.15 ms) until
# autovacuum analyzes the table, which may be minutes away (or never, where it is off). So the
# dispatcher analyzes the outbox itself when this many rows changed since its last ANALYZE.
STALE_STATISTICS_ROWS = 1000
_CHANGED_SINCE_ANALYZE = """
SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE schemaname = 'idem' AND relname = 'outbox'
"""

# When the next row may be claimed: a row behind an earlier pending row of its identity waits
# for that row, not for its own time (so a dispatcher does not poll for it).
_NEXT_DUE = """
SELECT extract(epoch FROM min(greatest(o.next_attempt_at, coalesce(o.claimed_until, o.next_attempt_at))) - now())
FROM idem.outbox o WHERE o.status = 'pending' AND o.effect = ANY(%s)
  AND NOT EXISTS (
      SELECT 1 FROM idem.outbox e
      WHERE e.effect = o.effect AND e.record_type = o.record_type AND e.external_id = o.external_id
        AND e.status = 'pending' AND e.seq < o.seq
  )
"""

_RECORD = """
UPDATE idem.outbox
SET status = %(status)s, last_status = %(http_status)s, last_response = %(response)s, reason = %(reason)s,
    next_attempt_at = CASE WHEN %(delay)s::float8 IS NULL THEN next_attempt_at
                           ELSE now() + make_interval(secs => %(delay)s::float8) END,
    delivered_at = CASE WHEN %(status)s = 'delivered' THEN now() END,
    claimed_by = NULL, claimed_until = NULL
WHERE key = %(key)s AND claimed_by = %(worker)s AND status = 'pending'
"""

# A delivered row's answer as data (``results_table:``): written by the transaction that marks it delivered.
_RESULT = """
INSERT INTO {table} (key, effect, record_type, external_id, record_key, response, status, delivered_at)
SELECT key, effect, record_type, external_id, record_key, %(data)s, last_status, delivered_at
FROM idem.outbox WHERE key = %(key)s AND status = 'delivered'
ON CONFLICT (key) DO UPDATE SET response = EXCLUDED.response, status = EXCLUDED.status,
    delivered_at = EXCLUDED.delivered_at
"""


@dataclass(frozen=True)
class Answer:
    """What one request got: the HTTP status (``None``: no answer), the text, ``Retry-After``."""

    status: int | None
    text: str
    retry_after: float | None = None
    done: bool = False  # a function effect returned (no HTTP status to judge)
    data: Any = None  # the whole answer as JSON (a results table's response), when kept

    @property
    def delivered(self) -> bool:
        return self.done or self.status is not None and 200 <= self.status < 300

    @property
    def transient(self) -> bool:
        return self.status is None or self.status in (408, 409, 425, 429) or self.status >= 500


@dataclass
class DeliveryReport:
    """What one ``deliver`` call did."""

    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    attempts: int = 0
    lost_claims: int = 0  # answers not recorded: the lease had passed to another dispatcher
    by_effect: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, effect: str, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        counts = self.by_effect.setdefault(effect, {"delivered": 0, "retrying": 0, "failed": 0})
        if outcome in counts:
            counts[outcome] += 1


def worker_name() -> str:
    """This dispatcher's name in ``claimed_by``: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def deliver(
    url: str,
    effects: Sequence[EffectConfig],
    *,
    wait_seconds: float = 0.0,
    limit: int | None = None,
    worker: str | None = None,
) -> DeliveryReport:
    """Deliver the due rows of ``effects`` until none is due (or ``limit`` attempts were made).

    ``wait_seconds``: keep going while a pending row becomes due (its backoff or another
    dispatcher's lease ends) within that many seconds from now.
    """
    worker = worker or worker_name()
    by_name = {effect.name: effect for effect in effects}
    names = sorted(by_name)
    leases = [by_name[name].lease_seconds for name in names]
    report = DeliveryReport()
    deadline = time.monotonic() + wait_seconds
    with connect(url, autocommit=True, application_name="idem-effects") as conn, Connections() as connections:
        ensure_results_tables(conn, sorted({e.results_table for e in effects if e.results_table}))
        refresh_statistics(conn)
        while limit is None or report.attempts < limit:
            row = conn.execute(_CLAIM, {"effects": names, "leases": leases, "worker": worker}).fetchone()
            if row is None:
                pause = _until_due(conn, names, deadline)
                if pause is None:
                    break
                time.sleep(pause)
                refresh_statistics(conn)  # commits meanwhile may have written many rows
                continue
            key, name, payload, attempts = row
            report.attempts += 1
            _attempt(conn, by_name[name], key, payload, int(attempts), worker, report, connections)
    return report


def refresh_statistics(conn: psycopg.Connection) -> bool:
    """``ANALYZE`` the outbox when :data:`STALE_STATISTICS_ROWS` rows or more changed since its
    last analysis: a commit's new rows, and the claims and answers of earlier deliveries (two
    changes each), so a dispatcher starting after a burst of 500 or more deliveries analyzes it
    once (about 0.1 s at 10,000 rows on a busy 2-core machine). Checked when a dispatcher starts and after each wait.

    ``SKIP_LOCKED``: a dispatcher never waits on another's ANALYZE or on autovacuum (PostgreSQL
    skips the table with a warning instead; so it does for a role that may not analyze it).
    """
    row = conn.execute(_CHANGED_SINCE_ANALYZE).fetchone()
    if row is None or row[0] is None or int(row[0]) < STALE_STATISTICS_ROWS:
        return False
    conn.execute("ANALYZE (SKIP_LOCKED) idem.outbox")
    return True


def _until_due(conn: psycopg.Connection, names: list[str], deadline: float) -> float | None:
    """How long to sleep before a pending row may be due, or ``None`` when none is due before ``deadline``."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    row = conn.execute(_NEXT_DUE, [names]).fetchone()
    if row is None or row[0] is None or float(row[0]) > left:
        return None
    return min(max(float(row[0]), 0.02), 0.5)


def _attempt(
    conn: psycopg.Connection, effect: EffectConfig, key: str, payload: Any, attempts: int, worker: str,
    report: DeliveryReport, connections: Connections | None = None,
) -> None:
    """Send one claimed row (unless its tries are spent) and record what came of it."""
    reason: str | None
    if attempts > effect.max_attempts:  # the dispatcher of the last try died before recording it
        answer = Answer(None, "the dispatcher of the last try stopped before recording an answer")
        outcome, reason, delay = "failed", f"max_attempts ({effect.max_attempts}) reached: {answer.text}", None
    else:
        answer = call(conn, effect, key, payload) if effect.python is not None else send(effect, key, payload, connections)
        outcome, reason, delay = _judge(effect, answer, attempts)
        checkpoint("effect_sent", effect=effect.name)
    status = {"retrying": "pending"}.get(outcome, outcome)
    params = {
        "status": status, "http_status": answer.status, "response": scrub(answer.text)[:MAX_RESPONSE_CHARS],
        "reason": reason, "delay": delay, "key": key, "worker": worker,
    }
    with conn.transaction():  # the outbox row and its result (results_table) together, or neither
        recorded = conn.execute(_RECORD, params).rowcount
        if recorded and status == "delivered" and effect.results_table is not None:
            conn.execute(
                sql.SQL(_RESULT).format(table=results_ident(effect.results_table)),
                {"key": key, "data": Jsonb(answer.data)},
            )
    if recorded:
        report.count(effect.name, outcome)
    else:
        report.lost_claims += 1


def _judge(effect: EffectConfig, answer: Answer, attempts: int) -> tuple[str, str | None, float | None]:
    """``(outcome, reason, delay)``: delivered, retrying after ``delay`` seconds, or failed with a reason."""
    if answer.delivered:
        return "delivered", None, None
    what = f"HTTP {answer.status}" if answer.status is not None else answer.text.split("\n", 1)[0][:300]
    if not answer.transient:
        return "failed", f"permanent answer: {what}", None
    if attempts >= effect.max_attempts:
        return "failed", f"max_attempts ({effect.max_attempts}) reached; last: {what}", None
    return "retrying", None, backoff(effect, attempts, answer.retry_after)


def backoff(effect: EffectConfig, attempts: int, retry_after: float | None) -> float:
    """Seconds before the next try: the receiver's ``Retry-After`` when given, else
    ``backoff_seconds * 2**(attempts-1)`` (at most ``max_backoff_seconds``) times a jitter
    in [0.5, 1], so dispatchers that failed together do not retry together."""
    if retry_after is not None:
        return max(retry_after, 0.0)
    ceiling = min(effect.max_backoff_seconds, effect.backoff_seconds * 2 ** (attempts - 1))
    return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (permanent), never followed: the key must not reach another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def call(conn: psycopg.Connection, effect: EffectConfig, key: str, payload: Any) -> Answer:
    """One call of ``effect``'s function for the row ``key``, exactly once per key once it returned
    (a recorded result is replayed); never raises: an exception is a transient answer."""
    python = effect.python
    assert python is not None  # noqa: S101 - the caller chose this path for a function effect
    function = python.resolve()

    def handler() -> dict[str, Any]:
        return {"result": function(payload, key)}

    try:
        recorded = run_idempotently(
            conn, f"{EFFECTS_NAMESPACE}.{effect.name}", key, payload, handler,
            transient=(Exception,), replay_window=FUNCTION_REPLAY_WINDOW,
        )
    except Exception as error:  # noqa: BLE001 - the user's function: any failure is an answer to retry
        return Answer(None, f"{type(error).__name__}: {error}")
    result = recorded.get("result")
    return Answer(None, json.dumps(result, ensure_ascii=False, default=str), done=True, data=result)


def send(effect: EffectConfig, key: str, payload: Any, connections: Connections | None = None) -> Answer:
    """One request of ``effect`` for the row ``key`` with body ``payload``; never raises.

    ``connections``: the dispatcher's kept-alive connections (a request no proxy carries goes
    on one, :mod:`.connections`); without them, or through a proxy, urllib sends it.
    """
    http = effect.http
    assert http is not None  # noqa: S101 - the caller chose this path for an HTTP effect
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    headers = {"Content-Type": "application/json", **http.headers, "Idempotency-Key": key}
    if not any(name.lower() == "user-agent" for name in headers):
        headers["User-Agent"] = USER_AGENT
    if connections is not None and direct(http.url):
        return _send_kept(connections, effect, data, headers)
    request = urllib.request.Request(http.url, data=data, method=http.method, headers=headers)
    try:
        with _OPENER.open(request, timeout=http.timeout_seconds) as response:
            if effect.results_table is None:
                return Answer(response.status, _text(response.read(MAX_RESPONSE_CHARS * 4)))
            whole = scrub(response.read(MAX_RESULT_BYTES).decode("utf-8", errors="replace"))
            return Answer(response.status, whole[:MAX_RESPONSE_CHARS], data=as_json(whole))
    except urllib.error.HTTPError as error:
        text = _text(error.read(MAX_RESPONSE_CHARS * 4)) if error.fp is not None else ""
        return Answer(error.code, text, _retry_after(error.headers.get("Retry-After")))
    except TimeoutError:
        return Answer(None, f"timeout after {http.timeout_seconds:g}s")
    except (urllib.error.URLError, HTTPException, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            return Answer(None, f"timeout after {http.timeout_seconds:g}s")
        return Answer(None, f"connection error: {type(reason).__name__}: {reason}")


def _send_kept(connections: Connections, effect: EffectConfig, data: bytes, headers: dict[str, str]) -> Answer:
    """:func:`send` on a kept-alive connection: the same answers as through urllib."""
    http = effect.http
    assert http is not None  # noqa: S101 - send() checked it
    limit = MAX_RESULT_BYTES if effect.results_table is not None else MAX_RESPONSE_CHARS * 4
    try:
        response = connections.exchange(http.method, http.url, data, headers, http.timeout_seconds, limit)
    except TimeoutError:
        return Answer(None, f"timeout after {http.timeout_seconds:g}s")
    except (HTTPException, OSError) as error:
        return Answer(None, f"connection error: {type(error).__name__}: {error}")
    if not 200 <= response.status < 300:
        return Answer(response.status, _text(response.body), _retry_after(response.headers.get("Retry-After")))
    if effect.results_table is None:
        return Answer(response.status, _text(response.body))
    whole = scrub(response.body.decode("utf-8", errors="replace"))
    return Answer(response.status, whole[:MAX_RESPONSE_CHARS], data=as_json(whole))


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")[:MAX_RESPONSE_CHARS]


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (an HTTP date is read as no hint: backoff applies)."""
    try:
        return min(float(value), 3600.0) if value is not None else None
    except ValueError:
        return None

