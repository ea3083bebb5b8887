"""Where a staged row's unknown fields go: an existing or new text column, or ``props``.

Decided per record type at apply time from the fields the staged rows carry in
``_extra``, because only then is the table's current set of columns known (another
commit may have added one meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import STRING, column_name_problem
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import existing_columns
from idem_platform.write.apply.attempts import StagedAttempt

MAX_NEW_COLUMNS = 32


def extra_fields(conn: psycopg.Connection, stage: sql.Composed) -> list[str]:
    """The unknown fields of a staged table's rows, in order of first appearance (so
    the columns a batch adds, and which fields overflow the budget, follow the input)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT k FROM {} s, jsonb_object_keys(s._extra) k "
            "WHERE s._extra IS NOT NULL GROUP BY k ORDER BY min(s._pos), k"
        ).format(stage),
    ).fetchall()
    return [row[0] for row in rows]


@dataclass
class Evolution:
    """Where one record type's unknown fields go in an insert: ``fill`` (text columns,
    existing or just ``added``) or ``to_props`` (with ``reasons``)."""

    fill: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    to_props: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # why each of to_props is not a column


def props_reasons(record_type: str, chosen: list[StagedAttempt], evolution: dict[str, str]) -> dict[str, str]:
    """Every field that went to ``props`` in this commit's rows of ``record_type``, with why:
    a name that cannot be a column (decided by coercion), or one evolution could not add."""
    reasons = {
        name: column_name_problem(name) or "not a column of this record type"
        for message in chosen
        for name in message.props_fields.get(record_type, ())
    }
    reasons.update(evolution)
    return dict(sorted(reasons.items()))


def evolution_without_columns(conn: psycopg.Connection, record_type: str, keys: list[str]) -> Evolution | None:
    """Where unknown fields go when no column has to be added; ``None`` if one has
    (streaming adds none: an ``ALTER TABLE`` would make readers wait from there on)."""
    result = Evolution()
    columns = existing_columns(conn, record_type)
    for key in keys:
        type_ = columns.get(key)
        if type_ is None:
            return None
        if type_ == STRING.postgres:
            result.fill.append(key)
        else:
            result.to_props.append(key)
            result.reasons[key] = f"{qualified_table_name(record_type)} has a {type_} column of that name, not text"
    return result
