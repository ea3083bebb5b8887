"""Step 2 of ``idem migrate``: the table brought to the current catalog, plus ``_payload_version``.

Driver-side DDL, run once per table before the Spark job; separate from the job
and the writer because it takes the commit path's DDL lock order, not row locks.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA, qualified_table_name
from idem_platform.postgres.tables import existing_columns, sync_tables, table_ident
from idem_platform.read.migrate.locks import with_lock_tries
from idem_platform.read.plan import PAYLOAD_VERSION


def prepare_table(conn: psycopg.Connection, config: IdemConfig, record_type: str, timeout: float) -> None:
    """The table in the current catalog's shape, plus ``_payload_version``.

    Columns declared since the last ingest are added (an upgraded row fills them), in
    :func:`~idem_platform.postgres.tables.sync_tables`' lock order; ``_payload_version``
    (``integer``, nullable: no rewrite of the table) under the same order, the DDL
    advisory lock, the catalog row, then the table, in short tries: ``ALTER TABLE``
    waits for the table's readers, and readers arriving meanwhile wait behind it.
    """
    sync_tables(conn, {record_type: config.table_specs[record_type]})
    if PAYLOAD_VERSION in existing_columns(conn, record_type):
        return

    def add() -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = %s FOR UPDATE", [record_type])
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} integer").format(
                table_ident(record_type), sql.Identifier(PAYLOAD_VERSION)
            )
        )
        conn.execute(
            sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                table_ident(record_type),
                sql.Identifier(PAYLOAD_VERSION),
                sql.Literal(
                    "idem: the schema_version of _payload, when idem migrate moved the row past it "
                    "(null: _schema_version)"
                ),
            )
        )

    with_lock_tries(conn, f"the catalog row and table of {qualified_table_name(record_type)}", timeout, add)

