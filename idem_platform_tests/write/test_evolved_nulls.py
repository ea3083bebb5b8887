"""Evolved text columns store a JSON ``null`` as SQL NULL, and DDL version 5 repairs rows
written before (when the commit that added the column stored the text ``'null'``).

A real string ``"null"`` is the text ``'null'``, before and after the repair: the repair
only touches a value whose row's ``_payload`` holds JSON null for that field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idem_platform.coercion.records import coerce_batch
from idem_platform.config import IdemConfig
from idem_platform.pipeline.ingest import current_tables
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.schema import migrations
from idem_platform.samples import write_lines
from idem_platform.sources.filedrop import hash_file
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.apply.transaction import apply_staged
from idem_platform.write.staging import StagingWriter, new_attempt_id
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.staging_fixture import claimed_plan

REPAIR = next(version for version, name, _ in migrations() if name == "evolved_json_null")


def _commit(pg_url: str, config: IdemConfig, directory: Path, name: str, lines: list[str]) -> dict[str, Any]:
    """One in-process commit of ``lines`` (evolve contract) with the tables as a run reads them."""
    path = write_lines(directory / name, lines)
    plan = claimed_plan(pg_url, current_tables(pg_url, config, config.connector("threatfeed")), hash_file(path))
    writer = StagingWriter(pg_url, plan, new_attempt_id())
    writer.write(coerce_batch(lines_batch([line.encode() for line in lines]), plan.spec))
    writer.close()
    with connect(pg_url) as conn:
        return apply_staged(conn, plan, [StagedAttempt(0, writer.attempt, writer.rows, writer.with_extra, writer.rejected)])


def _line(ext: str, **fields: Any) -> str:
    return json.dumps({"type": "indicator", "id": ext, "name": "n", **fields})


def _colours(pg_url: str) -> dict[str, Any]:
    return dict(rows(pg_url, "SELECT _external_id, colour FROM idem.indicator"))  # type: ignore[arg-type]


def test_an_evolved_column_stores_json_null_as_sql_null(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> None:
    lines = [_line("a", colour=None), _line("b", colour="null"), _line("c", colour="red"), _line("d", colour=5)]
    assert _commit(pg_url, threatfeed, tmp_path, "first.ndjson", lines)["rows_written"] == 4  # adds the column
    # A later commit fills the column, now in the catalog, as a string column.
    assert _commit(pg_url, threatfeed, tmp_path, "second.ndjson", [_line("e", colour=None), _line("f", colour="null")])[
        "rows_written"
    ] == 2
    assert _colours(pg_url) == {"a": None, "b": "null", "c": "red", "d": "5", "e": None, "f": "null"}
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator WHERE colour IS NULL") == [(2,)]
    ((columns,),) = rows(pg_url, "SELECT columns FROM idem.catalog WHERE record_type = 'indicator'")
    assert {"name": "colour", "type": "string", "required": False, "evolved": True} in columns


@pytest.mark.parametrize("actor_table", ["threat_actor", '"threat-actor"'])  # its name now, and before it had '_'
def test_the_repair_sets_what_old_commits_wrote_to_null_and_leaves_real_strings(
    pg_url: str, threatfeed: IdemConfig, tmp_path: Path, actor_table: str
) -> None:
    lines = [
        _line("a", colour=None, size=None),
        _line("b", colour="null", size=None),
        _line("c", colour="red", size="null"),
        _line("d"),
        json.dumps({"type": "threat-actor", "id": "t", "name": "n", "motive": None}),
    ]
    assert _commit(pg_url, threatfeed, tmp_path, "old.ndjson", lines)["rows_written"] == 5
    with connect(pg_url) as conn:
        # What the commit that added the columns stored before the fix: the text 'null' for
        # every JSON null; and 'null' text in a row whose _payload does not say null there.
        conn.execute("UPDATE idem.indicator SET colour = 'null' WHERE _external_id = 'a'")
        conn.execute("UPDATE idem.indicator SET size = 'null' WHERE _external_id IN ('a', 'b')")
        conn.execute("UPDATE idem.indicator SET colour = 'null' WHERE _external_id = 'd'")
        conn.execute("""UPDATE idem.threat_actor SET motive = 'null'""")
        if actor_table != "threat_actor":
            conn.execute(f"ALTER TABLE idem.threat_actor RENAME TO {actor_table}")
        conn.execute("DELETE FROM idem.schema_migrations WHERE version = %s", [REPAIR])
    before = dict(rows(pg_url, "SELECT _external_id, (colour, size)::text FROM idem.indicator"))
    assert before == {"a": "(null,null)", "b": "(null,null)", "c": "(red,null)", "d": "(null,)"}
    with connect(pg_url, autocommit=True) as conn:
        assert ensure_schema(conn) == [REPAIR]
    after = {ext: (colour, size) for ext, colour, size in rows(pg_url, "SELECT _external_id, colour, size FROM idem.indicator")}
    assert after == {
        "a": (None, None),
        "b": ("null", None),  # the string "null" stays
        "c": ("red", "null"),  # the string "null" stays
        "d": ("null", None),  # no such field in _payload: not the JSON null the repair is for
    }
    assert rows(pg_url, f"SELECT motive FROM idem.{actor_table}") == [(None,)]
    with connect(pg_url, autocommit=True) as conn:
        assert ensure_schema(conn) == []  # once
