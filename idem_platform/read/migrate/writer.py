"""Writing upgraded rows back: one task's connection, one transaction per batch.

Each batch is COPYed (binary, via pgpq) into a temporary table, then moved by one
``UPDATE … FROM`` guarded by the version (see :mod:`idem_platform.read.migrate`: a
row moved already is skipped and not counted). Separate from :mod:`.task`, which
decides *what* to write: this module is the only one that holds SQL for the
target table's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import pgpq
import pgpq.encoders
import pgpq.schema
import psycopg
import pyarrow as pa
from psycopg import sql

from idem_platform.postgres.connection import connect
from idem_platform.postgres.current import refold
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import table_ident
from idem_platform.read.migrate.errors import MigrateError
from idem_platform.read.migrate.locks import with_lock_tries
from idem_platform.read.plan import PAYLOAD_VERSION, ReadColumn, ReadPlan

TEMP_TABLE = "idem_migrate_rows"
FROM_VERSION = "_from_version"
# The PostgreSQL type of each frame kind (the temporary table's columns: the binary COPY
# must match the types the Arrow encoders write, and the target's columns have them too).
_PG_TYPES = {
    "text": "text",
    "json": "jsonb",
    "bool": "boolean",
    "int": "integer",
    "long": "bigint",
    "real": "double precision",
    "timestamp": "timestamp with time zone",
    "vector": "real[]",
}


class BatchWriter:
    """One task's connection: batches COPYed into a temporary table, then moved by one
    guarded ``UPDATE``, one transaction per batch."""

    def __init__(
        self, read: ReadPlan, writes: Sequence[ReadColumn], lock_timeout_seconds: float, schema: pa.Schema
    ) -> None:
        self.read = read
        self.lock_timeout_seconds = lock_timeout_seconds
        self.schema = schema
        plan = read
        json_columns = {c.name for c in writes if c.kind == "json"}
        self.encoders = {
            field.name: pgpq.encoders.StringEncoderBuilder.new_with_output(field, pgpq.schema.Jsonb())
            if field.name in json_columns
            else pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(field)
            for field in schema
        }
        self._pgpq = pgpq
        temp = sql.Identifier(TEMP_TABLE)
        definitions = [
            sql.SQL('_idempotency_key text COLLATE "C" NOT NULL'),
            sql.SQL("{} integer NOT NULL").format(sql.Identifier(FROM_VERSION)),
        ] + [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(_PG_TYPES[c.kind])) for c in writes]
        self.conn = connect(plan.url, autocommit=True, application_name="idem-migrate")
        self.conn.execute(
            sql.SQL("CREATE TEMPORARY TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                temp, sql.SQL(", ").join(definitions)
            )
        )
        self.copy = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
            temp, sql.SQL(", ").join(sql.Identifier(name) for name in schema.names)
        )
        sets = [sql.SQL("{} = b.{}").format(sql.Identifier(c.name), sql.Identifier(c.name)) for c in writes]
        sets.append(sql.SQL("_schema_version = {}").format(sql.Literal(plan.current_version)))
        payload = sql.Identifier(PAYLOAD_VERSION)
        sets.append(sql.SQL("{} = coalesce(t.{}, t._schema_version)").format(payload, payload))
        self.update = sql.SQL(
            "WITH moved AS ("
            "UPDATE {table} AS t SET {sets} FROM {temp} AS b "
            "WHERE t._idempotency_key = b._idempotency_key AND t._schema_version < {current} "
            "AND coalesce(t.{payload}, t._schema_version) = b.{start} "
            "RETURNING b.{start}"
            ") SELECT {start}, count(*) FROM moved GROUP BY 1"
        ).format(
            table=table_ident(plan.record_type),
            sets=sql.SQL(", ").join(sets),
            temp=temp,
            current=sql.Literal(plan.current_version),
            payload=sql.Identifier(PAYLOAD_VERSION),
            start=sql.Identifier(FROM_VERSION),
        )

    def write(self, rows: pa.Table) -> dict[int, int]:
        """Move ``rows`` in one transaction (tried again on lock trouble); the rows moved per
        start version (rows moved already by someone else are not counted)."""
        pgpq = self._pgpq
        batches = rows.to_batches()
        plan = self.read

        def work() -> dict[int, int]:
            encoder = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(self.schema, self.encoders)
            with self.conn.cursor() as cursor:
                with cursor.copy(self.copy) as copy:
                    copy.write(encoder.write_header())
                    for batch in batches:
                        copy.write(encoder.write_batch(batch))
                    copy.write(encoder.finish())
                moved = {int(v): int(n) for v, n in cursor.execute(self.update).fetchall()}
            if plan.spec.upsert is not None:  # the moved rows' order or identity may have changed
                refold(self.conn, plan.spec, sql.SQL("SELECT _idempotency_key FROM {}").format(sql.Identifier(TEMP_TABLE)))
            return moved

        try:
            return with_lock_tries(
                self.conn, f"rows of {qualified_table_name(plan.record_type)}", self.lock_timeout_seconds, work,
                undone="that batch was rolled back, batches committed before stay",
            )
        except psycopg.DataError as exc:
            keys = rows.column("_idempotency_key")
            raise MigrateError(
                f"{qualified_table_name(plan.record_type)}: PostgreSQL refused the upgraded rows of the batch from key "
                f"{keys[0].as_py()} to {keys[len(keys) - 1].as_py()}: {str(exc).strip().splitlines()[0]}"
            ) from exc

    def close(self) -> None:
        self.conn.close()

