"""A commit plan of one dropped file, claimed in the ledger, its staging templates made:
what the attempt tests stage into and apply, without Spark in between."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

from idem_platform.coercion.records import RecordSpec
from idem_platform.contract.catalog import TableSpec
from idem_platform.ledger import Ledger
from idem_platform.postgres import connect
from idem_platform.postgres.tables import tables_with_rows
from idem_platform.sources.filedrop import DroppedFile, FileSlice, batch_of_files
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import create_staging


def claimed_plan(pg_url: str, tables: dict[str, TableSpec], file: DroppedFile, *, probe: bool = False) -> CommitPlan:
    """One input partition per split of ``file``; ``probe``: look up the keys of the tables
    that hold rows now, as ``commit_batch`` plans it."""
    batch = batch_of_files("threatfeed", [file], {})
    spec = RecordSpec(
        connector="threatfeed", tables=tables, units=((batch.pending[0].position_prefix, 0),),
        record_type_field="type", spark_types=True,
    )
    commit_id = str(uuid.uuid4())
    plan = CommitPlan(
        commit_id=commit_id, connector="threatfeed", run_id="t", owner=f"t/{commit_id}", units=batch.pending,
        slices=tuple(FileSlice(((file, split),)) for split in file.splits), tables=tables, evolve=True,
        max_reject_ratio=1.0, replay=False, replay_window_seconds=3600, started_at=datetime.now(UTC).isoformat(),
        spec=spec,
    )
    with connect(pg_url) as conn:
        with conn.transaction():
            Ledger(conn, "threatfeed").begin(file.key, {"connector": "threatfeed", "file_key": file.key}, owner=plan.owner)
            if probe:
                plan = replace(plan, probe_known=tables_with_rows(conn, sorted(tables)))
        create_staging(conn, plan)
    return plan
