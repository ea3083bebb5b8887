"""Effects' results tables as Dagster assets: ``idem/<results_table>`` beside the record tables.

An effect with ``results_table: NAME`` keeps each delivered answer as a row of ``idem.NAME``
(:mod:`idem_platform.effects.results`). Its asset is keyed ``["idem", NAME]`` like the
record tables (:func:`~idem_platform.defs.tables.table_key`: the schema and the table), in
their group, downstream of the table asset of the effect's record type, and loaded by the
same IO manager (``idem_table_io_manager``): an asset with
``ins={"enrichment": dg.AssetIn(["idem", NAME])}`` receives the rows as a lazy Spark
DataFrame. Like a record table it is an :class:`~dagster.AssetSpec`, not materializable:
only the delivery that records an answer writes a row, so each ``idem_effects_deliver``
run that wrote results reports a materialization of the table (:func:`results_materializations`)
with its row count, which is what an eager downstream asset reacts to.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.config.effects import EffectConfig
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.defs.tables import (
    EXACT_COUNT_MAX_BYTES,
    TABLE_GROUP,
    check_not_shadowed,
    count_relation,
    table_key,
    writers,
)
from idem_platform.effects.results import results_ident
from idem_platform.postgres.schema import SCHEMA

EFFECT_TAG = "idem/effect"
# The columns of every results table (effects.results' DDL), as the UI shows them.
RESULTS_COLUMNS = (
    ("key", "text", "the minted key (primary key): the outbox row this answers", False),
    ("effect", "text", "the effect", False),
    ("record_type", "text", "the record type of the row the effect fired on", False),
    ("external_id", "text", "the row's external id", True),
    ("record_key", "text", "the row's `_idempotency_key`: join the record table on it", False),
    ("response", "jsonb", "the answer: the HTTP body parsed as JSON (else a JSON string), or a function's result", True),
    ("status", "integer", "the HTTP status (null for a Python function)", True),
    ("delivered_at", "timestamptz", "when the delivery was recorded", False),
)


def results_schema() -> dg.TableSchema:
    """The columns of a results table (``dagster/column_schema``)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name, type_, description=note,
                constraints=dg.TableColumnConstraints(nullable=nullable, unique=name == "key"),
            )
            for name, type_, note, nullable in RESULTS_COLUMNS
        ]
    )


def results_effects(config: IdemConfig) -> list[EffectConfig]:
    """The effects of ``config`` that keep a results table."""
    return [effect for effect in config.effects if effect.results_table]


def results_asset_specs(config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS) -> list[dg.AssetSpec]:
    """One loadable, non-materializable asset per results table, downstream of its record type's
    table asset (when a connector writes that table).

    Raises:
        ConfigError: a connector named ``idem`` and a results table named like one of its steps.
    """
    tables = writers(config)
    specs = []
    for effect in results_effects(config):
        name = str(effect.results_table)
        check_not_shadowed(config, name, "results table")
        key = table_key(name)
        specs.append(
            dg.AssetSpec(
                key,
                deps=[table_key(effect.record_type)] if effect.record_type in tables else [],
                group_name=TABLE_GROUP,
                kinds={"postgres"},
                tags={EFFECT_TAG: effect.name},
                description=(
                    f"The results table `{SCHEMA}.{name}` of the effect `{effect.name}` on `{effect.record_type}`: "
                    "one row per delivered key with the receiver's answer (`response`, jsonb). Only the "
                    "delivery that records an answer writes it; each `idem_effects_deliver` run that wrote rows "
                    "reports a materialization here with the row count. "
                    f"An asset with `ins={{'{name}': AssetIn({list(key.path)!r})}}` receives it as a Spark "
                    "DataFrame (`response` as JSON text), oldest delivery first."
                ),
                metadata={
                    "dagster/table_name": f"{SCHEMA}.{name}",
                    "dagster/column_schema": results_schema(),
                    "effect": effect.name,
                },
            ).with_io_manager_key(resource_keys.table_io_manager)
        )
    return specs


def count_results(conn: psycopg.Connection, name: str, *, exact_max_bytes: int = EXACT_COUNT_MAX_BYTES) -> int:
    """The rows of ``idem.<name>`` (0 while it does not exist; PostgreSQL's estimate above ``exact_max_bytes``)."""
    query = sql.SQL("SELECT count(*) FROM {}").format(results_ident(name))
    return count_relation(conn, name, query, exact_max_bytes).rows


def results_materializations(
    conn: psycopg.Connection, effects: list[EffectConfig], delivered: Mapping[str, int]
) -> list[dg.AssetMaterialization]:
    """A materialization of each results table a delivery run wrote rows to (``delivered``:
    effect -> rows delivered by the run; a delivered row of an effect with a results table is
    one row written)."""
    events = []
    for effect in effects:
        written = int(delivered.get(effect.name, 0))
        if not effect.results_table or not written:
            continue
        name = effect.results_table
        rows = count_results(conn, name)
        events.append(
            dg.AssetMaterialization(
                asset_key=table_key(name),
                description=f"{written:,} answers of {effect.name} recorded",
                metadata={
                    "dagster/row_count": dg.MetadataValue.int(rows),
                    "rows_written": dg.MetadataValue.int(written),
                    "effect": dg.MetadataValue.text(effect.name),
                },
            )
        )
    return events
