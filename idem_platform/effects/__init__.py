"""Outbound effects exactly once (DESIGN §9): rows written with the commit, delivered with minted keys.

An effect (``effects:`` in ``idem.yaml``) acts on the *written* rows of a record type that
meet a declarative condition. The promoting transaction of a commit inserts one row per
qualifying written row into ``idem.outbox`` (:mod:`.outbox`), so an effect exists if and
only if its row was committed, once; a run tagged as a replay creates none. A dispatcher
(:mod:`.delivery`, ``idem effects deliver``) claims due rows with ``FOR UPDATE SKIP
LOCKED`` and a lease, sends each with ``Idempotency-Key: <minted key>`` (the same on every
attempt), retries transient failures with backoff and parks permanent ones.

Modules: :mod:`idem_platform.config.effects` (the ``effects:`` models, checked at load), :mod:`.rule` (what a
commit needs of an effect), :mod:`.outbox` (the commit's share), :mod:`.delivery` (the
dispatcher), :mod:`.admin` (list, retry, purge).
"""
