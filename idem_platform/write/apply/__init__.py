"""The one applying transaction of a commit: staged rows into the tables (DESIGN §5).

Opened on the driver when the first slice is staged, it streams each slice's
accepted attempt into the target tables while later slices are still being
staged, holding no table lock beyond the ``ROW EXCLUSIVE`` of any ``INSERT``
(readers and other writers go on). Once every slice is staged, it:

1. re-checks the ledger rows of the batch's units under ``FOR UPDATE`` (still
   ``in_progress`` and owned by this commit, or nothing is applied);
2. per record type, widens the table for new fields (the only lock readers
   wait for) and inserts what streaming left, first occurrence per key,
   skipping keys already present;
3. runs the source's commit step (the Kafka offsets' compare-and-set: if
   another run moved them, nothing commits), then records rejects, the
   execution log, the ``commits`` row and the ledger results;
4. drops the staging tables.

A crash before COMMIT leaves nothing visible; a retry after COMMIT finds the
ledger committed and replays. The insert is a single write into the target:
an anti-join excludes committed keys, so no ``ON CONFLICT`` speculative
insertion is paid per row, unless another writer's keys collided with ours
(see :class:`~idem_platform.write.apply.transaction.ApplyTransaction`).

**Words.** "Apply" is this step and only it: the crash points ``before_apply``,
``during_apply`` and ``after_apply`` (:mod:`idem_platform.faults`) and the progress line
``applying N records into …`` name it. "Retyped" columns are ``idem retype``'s: text
columns with a typed companion, which :mod:`.rows` fills in the same insert.

**Modules**, one concern each: :mod:`.transaction` (the transaction itself, and
:func:`~idem_platform.write.apply.transaction.apply_staged` for messages already
collected), :mod:`.attempts` (which staged attempt of each slice counts),
:mod:`.claim` (the claim re-check), :mod:`.locks` (bounded lock waits),
:mod:`.evolution` (where unknown fields go), :mod:`.rows` (the insert of staged
rows), :mod:`.rejects` and :mod:`.result` (the result, the ``commits`` row, the
ledger's share, a replay's commit). Callers import from those modules; this package
re-exports nothing.
"""
