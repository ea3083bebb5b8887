"""``idem migrate``: rows of ``idem.<record_type>`` older than its ``schema_version``, upgraded in place.

The read path (:mod:`idem_platform.read.table`) already returns every row in the
current shape; ``idem migrate`` makes that shape durable, so reads stop paying for
the upgrade and SQL users see current values. Per record type:

1. **Count** (driver, one ``GROUP BY`` statement): the rows below the current
   version, by the version their upgrade starts from, and the steps they go through
   (a v1 row at current v3 moves through v1->v2 and v2->v3: step counts are
   cumulative). ``--dry-run`` stops here and writes nothing (no DDL either).
2. **Prepare** (driver, short DDL under the commit path's lock order: the DDL advisory
   lock, the catalog row, then the table, in 2 s ``lock_timeout`` tries): the table gets
   the current catalog's columns (:func:`~idem_platform.postgres.tables.sync_tables`)
   and the nullable column ``_payload_version``.
3. **Upgrade and write** (executors, never a driver loop over rows): one Spark task
   per key range of the read plan (:func:`~idem_platform.read.planner.plan_read`), over
   ``mapInArrow``. Each task reads its range's old rows with the read path's COPY
   (:func:`~idem_platform.read.decode.read_rows`, only ``_idempotency_key``,
   ``_connector``, ``_schema_version`` and ``_payload``), upgrades them with the read
   path's own :func:`~idem_platform.read.upgrade.upgrade_batch` (so a migrated row
   holds exactly what a read returned for it before), and writes them back
   ``batch_rows`` at a time, **one transaction per batch**: a binary COPY into a
   temporary table, then one ``UPDATE … FROM`` the temporary table guarded by the
   version (below). Row locks only; each try waits 2 s at most for a lock, and a lock
   timeout, a lost deadlock or a serialization failure rolls the batch back and tries
   it again (up to ``lock_timeout_seconds``).

**What changes in a row**: its typed columns (declared and evolved), each retyped
column's typed companion (``<column>__<kind>``, cast from the upgraded text the way
``idem retype`` casts it), ``props``, ``_schema_version`` (to the current version) and
``_payload_version``. Never ``_idempotency_key``, ``_commit_id``, ``_ingested_at``,
``_source``, ``_content_hash`` or ``_payload``; columns the current catalog no longer
has (``temp`` after its rename) keep their old values.

**Why ``_payload`` stays as received.** ``_payload`` is the record as it arrived
(DESIGN §4): the key's content hash is computed from it, ``idem rejects retry`` and
audits rely on it, and every upgrade starts from it (typed columns lose fields that
``props`` or a dropped contract left out). Rewriting it to the upgraded record would
lose the original, or need a second copy of every payload. Instead the row records
the version its payload is in: ``_payload_version`` is set, once, to the version the
row had before its first migration (null means "same as ``_schema_version``"). A
migrated row is read as it is stored (it is at the current version); when
``schema_version`` is bumped again, the read path upgrades it from its payload's own
version (:meth:`~idem_platform.read.plan.ReadPlan.query` selects
``coalesce(_payload_version, _schema_version)`` for rows below the current version),
and so does the next ``idem migrate``: the upgrade always runs the whole chain from
the payload, exactly as for a row never migrated.

**The version guard** makes a rerun, a crash and a second ``idem migrate`` running at
the same time harmless: the ``UPDATE`` only touches a row still below the current
version whose payload version is the one the upgrade started from (``t._schema_version
< current AND coalesce(t._payload_version, t._schema_version) = b._from_version``). A
row moved already (by an earlier batch, a killed run, the other migrate) is skipped
and not counted; a row is never moved backwards (a migrate with an older config finds
nothing below its version). Killed midway, the committed batches stay; a rerun reads
the rows still below the current version and moves those: every row ends at the
current version exactly once, and a second run reports 0 rows moved and writes
nothing.

**A row whose migration fails** (the function raises, or its result does not fit the
catalog) fails the migrate with :class:`~idem_platform.migrations.MigrationFailed`
naming the row's key and the step; batches committed before stay migrated. With
``skip_failed`` it is counted (per step, with the first examples) and left at its
version, where reads still upgrade (and fail) it. Rows stored at a version *newer*
than the config's are counted (``rows_newer``) and never touched.

**Counts.** Each task reports the rows its committed batches moved (per start version,
from the ``UPDATE``'s own result); ``rows_left``, counted after the job, is the number of
rows still below the current version. A task Spark runs again (an executor lost) reads
its range's rows still below the version and moves them: batches its failed attempt
committed stay, but only the successful attempt's counts reach the report.

**Modules**, one per step, so each can be read alone: :mod:`.counts` (step 1, the
dry run), :mod:`.prepare` (step 2), :mod:`.task` and :mod:`.writer` (step 3 on the
executors: upgrade, then write back), :mod:`.job` (step 3 on the driver),
:mod:`.run` (:func:`~idem_platform.read.migrate.run.migrate`, the steps in order),
:mod:`.report`, :mod:`.locks` and :mod:`.errors`. Callers import from those
modules; this package re-exports nothing.
"""
