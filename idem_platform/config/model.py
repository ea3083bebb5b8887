"""The whole ``idem.yaml``: connectors, tables, migrations, assets and Spark, checked together."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from idem_platform.config.common import ConfigModel, SchemaContract
from idem_platform.config.connectors import ConnectorConfig
from idem_platform.config.effects import EffectConfig, check_effects
from idem_platform.config.spark import SparkConfig
from idem_platform.config.tables import TableConfig
from idem_platform.contract.catalog import (
    CURRENT_SUFFIX,
    MAX_IDENTIFIER_BYTES,
    RESERVED_TABLE_NAMES,
    Column,
    ColumnType,
    TableSpec,
    table_name,
    upsert_relations,
)
from idem_platform.contract.keys import NAME_PATTERN
from idem_platform.contract.otlp_logs import DEFAULT_LOG_RECORD_TYPE, LOG_COLUMNS
from idem_platform.effects.rule import OutboxRule
from idem_platform.errors import ConfigError
from idem_platform.migrations import (
    Chains,
    MigrationChainError,
    MigrationSource,
    check_chains,
    load_modules,
)
from idem_platform.settings import (
    SPARK_SERVER_ENV,
    spark_master_from_environment,
    spark_server_from_environment,
)


class IdemConfig(ConfigModel):
    """The whole ``idem.yaml``."""

    # Validated in this order: the connectors last, as they are given what they need of the others.
    tables: dict[str, TableConfig] = Field(default_factory=dict)
    migrations: list[str] = Field(default_factory=list)
    implicit_tables: tuple[str, ...] = Field(
        (), exclude=True, description="Tables no `tables:` entry declared (an otlp connector's log type)."
    )
    effect_modules: list[str] = Field(
        default_factory=list,
        description="Python modules whose functions effects may call (python.function); importable from the "
        "config file's directory too.",
    )
    effects: list[EffectConfig] = Field(
        default_factory=list, description="Outbound effects on written rows (docs/effects.md)."
    )
    connectors: list[ConnectorConfig] = Field(default_factory=list)
    assets: list[str] = Field(
        default_factory=list,
        description=(
            "Python modules whose Dagster assets and asset checks join the generated definitions "
            "(e.g. assets reading idem's table assets as Spark DataFrames); importable from the "
            "config file's directory too."
        ),
    )
    spark: SparkConfig = Field(default_factory=SparkConfig)
    source: Path | None = Field(None, exclude=True, description="The file this was read from.")

    @model_validator(mode="before")
    @classmethod
    def _otlp_defaults(cls, data: Any) -> Any:
        """An ``otlp`` connector routes every log record to one type (default ``log``) keyed
        by content; that type's table needs no ``tables:`` entry (it is OTLP's log shape)."""
        if not isinstance(data, dict) or not isinstance(data.get("connectors"), list):
            return data
        otlp = [c for c in data["connectors"] if isinstance(c, dict) and c.get("kind") == "otlp"]
        if not otlp:
            return data

        tables = dict(data.get("tables") or {})
        connectors, implicit = [], []
        for connector in data["connectors"]:
            if isinstance(connector, dict) and connector.get("kind") == "otlp":
                connector = {"missing_id": "content", **connector}
                if "record_type_field" not in connector:
                    connector.setdefault("record_type", DEFAULT_LOG_RECORD_TYPE)
                name = connector.get("record_type")
                if isinstance(name, str) and name not in tables:
                    tables[name] = {"columns": dict(LOG_COLUMNS)}
                    implicit.append(name)
            connectors.append(connector)
        return {**data, "connectors": connectors, "tables": tables, "implicit_tables": tuple(implicit)}

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: dict[str, TableConfig]) -> dict[str, TableConfig]:
        for name in value:
            if NAME_PATTERN.fullmatch(name) is None or len(name) > MAX_IDENTIFIER_BYTES:
                raise ValueError(
                    f"record type {name!r} must match [a-z0-9_-]{{1,{MAX_IDENTIFIER_BYTES}}} "
                    "(PostgreSQL cuts longer table names)"
                )
            if table_name(name) in RESERVED_TABLE_NAMES:
                what = "is the name of" if table_name(name) == name else f"would be the table idem.{table_name(name)},"
                raise ValueError(
                    f"record type {name!r} {what} one of idem's own tables in schema idem "
                    f"({', '.join(sorted(RESERVED_TABLE_NAMES))}): pick another"
                )
        tables: dict[str, str] = {}
        for name in value:
            other = tables.setdefault(table_name(name), name)
            if other != name:
                raise ValueError(
                    f"record types {other!r} and {name!r} would share the table idem.{table_name(name)} "
                    "(a table name spells '-' as '_'): rename one of them"
                )
        for name, table in value.items():
            if table.mode != "upsert":
                continue
            for derived in upsert_relations(name):
                if len(derived) > MAX_IDENTIFIER_BYTES:
                    raise ValueError(
                        f"record type {name!r}: its upsert table's {derived!r} is longer than PostgreSQL's "
                        f"{MAX_IDENTIFIER_BYTES}-byte names; pick a name of at most "
                        f"{MAX_IDENTIFIER_BYTES - len(CURRENT_SUFFIX)} characters"
                    )
                if derived in tables or derived in RESERVED_TABLE_NAMES:
                    state, current = upsert_relations(name)
                    raise ValueError(
                        f"record types {name!r} (mode: upsert) and {tables.get(derived, derived)!r} would share "
                        f"the table idem.{derived} (the current state of {name!r} lives in idem.{state} "
                        f"and idem.{current}): rename one"
                    )
        return value

    @field_validator("effects")
    @classmethod
    def _effects_fit(cls, effects: list[EffectConfig], info: ValidationInfo) -> list[EffectConfig]:
        """Each effect fits its table; a function effect's module is listed and imports (now, at load:
        a typo fails the config, not the first delivery)."""
        if "tables" in info.data:
            if any(effect.python is not None for effect in effects):
                source = info.context.get("source") if isinstance(info.context, dict) else None
                load_modules([], Path(source).parent if source is not None else None)  # its directory on sys.path
            check_effects(effects, info.data["tables"], info.data.get("effect_modules") or [])
        return effects

    @model_validator(mode="after")
    def _references(self) -> IdemConfig:
        seen: dict[str, str] = {}
        for connector in self.connectors:
            # Every Dagster name of a connector is spelt with '_' for '-': feed-a and feed_a would clash.
            name = connector.identifier
            if name in seen:
                other = seen[name]
                raise ValueError(
                    f"connector name {connector.name!r} is used twice"
                    if other == connector.name
                    else f"connector names {other!r} and {connector.name!r} are both {name!r} in Dagster (asset "
                    "keys, group, job, sensor: '-' and '_' are one character there); rename one"
                )
            seen[name] = connector.name
            if connector.record_type is not None and connector.record_type not in self.tables:
                raise ValueError(
                    f"connector {connector.name!r}: record_type {connector.record_type!r} is not "
                    f"in tables ({', '.join(sorted(self.tables)) or 'none declared'})"
                )
            self._check_versions(connector)
        self._check_debezium()
        return self

    def _check_debezium(self) -> None:
        """A table fed by a ``format: debezium`` connector is ``mode: upsert`` with an
        ``identity`` (the row's primary-key fields) and no ``order_by``, ``delete_when`` or
        ``dynamic`` column or schema version bump (its order is the source position, ``op: d``
        its delete, and the envelope in ``_payload`` is not the row), and no other connector
        writes it. (An upsert table without ``order_by`` that no Debezium connector feeds is
        in the source's own order.)"""
        fed = {c.record_type: c.name for c in self.connectors if c.debezium and c.record_type is not None}
        for name, feeder in fed.items():
            table = self.tables[name]
            problem = None
            if table.mode != "upsert" or not table.identity:
                problem = "must be mode: upsert with an identity (the row's primary-key fields)"
            elif table.order_by is not None or table.delete_when is not None:
                problem = "takes no order_by or delete_when (the order is the source position, op d deletes)"
            elif any(ColumnType.parse(c.type).kind == "dynamic" for c in table.columns.values()):
                problem = "has no dynamic columns on a Debezium feed"
            elif table.schema_version != 1:
                problem = "stays at schema_version 1 (migrations read _payload, which holds the change event, not the row)"
            if problem is not None:
                raise ValueError(f"tables.{name} (fed by format: debezium connector {feeder!r}) {problem}")
        for connector in self.connectors:
            others = set(self.tables_for(connector)) & set(fed) if not connector.debezium else set()
            if others:
                name = sorted(others)[0]
                raise ValueError(
                    f"connector {connector.name!r} could write tables.{name}, which format: debezium connector "
                    f"{fed[name]!r} feeds (ordered by source position): give it another record_type"
                )

    def _check_versions(self, connector: ConnectorConfig) -> None:
        """A connector's declared ``schema_version`` must exist for its fixed record type, and
        its ``schema_version_field`` must not be a declared column (it is a system field)."""
        if connector.schema_version is not None and connector.record_type is not None:
            current = self.tables[connector.record_type].schema_version
            if connector.schema_version > current:
                raise ValueError(
                    f"connector {connector.name!r}: schema_version {connector.schema_version} is newer than "
                    f"tables.{connector.record_type}.schema_version ({current})"
                )
        names = (
            [connector.record_type]
            if connector.record_type is not None
            else sorted(name for name in self.tables if name not in self.implicit_tables)
        )
        for name in names:
            if connector.schema_version_field in self.tables[name].columns:
                raise ValueError(
                    f"connector {connector.name!r}: schema_version_field {connector.schema_version_field!r} is "
                    f"a column of {name}; it names the field that states a record's schema_version (a system "
                    "field, never a column): rename the column or set another schema_version_field"
                )

    @field_validator("connectors")
    @classmethod
    def _share(cls, connectors: list[ConnectorConfig], info: ValidationInfo) -> list[ConnectorConfig]:
        """Give each connector what it needs of the rest of the file, as fields of its own:
        the config's migrations (``migrations``: the executors that coerce its records import
        them to upgrade old ones) and the ``schema_contract`` of the record types it writes
        that set their own (``table_contracts``, :meth:`ConnectorBase.contract_for`).

        Executors get a connector, not the whole config. ``tables:`` and ``migrations:``
        are validated before ``connectors:`` (field order); when either failed, its errors
        are reported and nothing is shared. The config file's directory comes from the
        validation context (:func:`~idem_platform.config.loader.parse_config` passes it)."""
        if "tables" not in info.data or "migrations" not in info.data:
            return connectors
        tables: dict[str, TableConfig] = info.data["tables"]
        implicit: tuple[str, ...] = info.data.get("implicit_tables", ())
        source = info.context.get("source") if isinstance(info.context, dict) else None
        shared = _migration_source(tables, info.data["migrations"], Path(source) if source is not None else None)
        effects: list[EffectConfig] = info.data.get("effects") or []
        return [
            connector.model_copy(
                update={
                    "migrations": shared,
                    "table_contracts": _own_contracts(connector, tables, implicit),
                    "effects": _own_effects(connector, effects, tables, implicit),
                }
            )
            for connector in connectors
        ]

    def chains(self) -> Chains:
        """Import the ``migrations:`` modules (the config file's directory on ``sys.path``) and
        validate every record type's chain against its current ``schema_version``.

        Called when the definitions are built, so a broken chain fails the code location's
        load, and by the commands that ingest or read.

        Raises:
            ConfigError: a module cannot be imported.
            MigrationChainError: a chain has a gap, a duplicate or a step past the current
                version (one line naming the record type and the step).
        """

        where = _str(self.source)
        try:
            load_modules(self.migrations, self.source.parent if self.source is not None else None)
            return check_chains(dict(_migration_source(self.tables, self.migrations, self.source).current), self.migrations)
        except MigrationChainError as exc:
            raise MigrationChainError(" ".join(str(exc).split("\n  ")), path=where, key="migrations") from None
        except ConfigError as exc:
            raise ConfigError(str(exc), path=where, key="migrations") from exc

    @cached_property
    def table_specs(self) -> dict[str, TableSpec]:
        """The declared tables as catalog specs. An upsert table's order and identity
        columns are required: a record without them is a reject (rules ``order``, ``identity``)."""
        specs = {}
        debezium = {c.record_type for c in self.connectors if c.debezium}
        for name, table in self.tables.items():
            upsert = table.upsert_spec(debezium=name in debezium)
            rules = {} if upsert is None else {**dict.fromkeys(upsert.identity, "identity"), upsert.order_by: "order"}
            specs[name] = TableSpec(
                name,
                table.schema_version,
                tuple(
                    Column(col, ColumnType.parse(cfg.type), cfg.required or col in rules, rule=rules.get(col, "required"))
                    for col, cfg in table.columns.items()
                ),
                upsert=upsert,
            )
        return specs

    def connector(self, name: str) -> ConnectorConfig:
        """The connector called ``name``: as written in ``idem.yaml`` or as Dagster spells it
        (its :attr:`identifier`, ``threatfeed_push`` for ``threatfeed-push``), so a name copied
        from the UI works too (two connectors never share an identifier).

        Raises:
            ConfigError: naming the connectors that exist.
        """
        for connector in self.connectors:
            if connector.name == name:
                return connector
        for connector in self.connectors:
            if connector.identifier == name:
                return connector
        known = ", ".join(c.name for c in self.connectors) or "none"
        raise ConfigError(f"no connector named {name!r} (known: {known})", path=_str(self.source))

    def tables_for(self, connector: ConnectorConfig) -> dict[str, TableSpec]:
        """The tables a connector may write: its fixed type, or, when routed, every table
        ``tables:`` declares (an otlp connector's implicit log table is its own)."""
        if connector.record_type is not None:
            return {connector.record_type: self.table_specs[connector.record_type]}
        return {name: spec for name, spec in self.table_specs.items() if name not in self.implicit_tables}

    def shown(self, path: Path | None) -> str:
        """``path`` as the config names it: relative to the config file when inside its folder
        (descriptions in the UI carry no machine paths)."""
        if path is None:
            return "-"
        if self.source is not None:
            try:
                return path.relative_to(self.source.parent.resolve()).as_posix()
            except ValueError:
                pass
        return str(path)

    def spark_master(self) -> str:
        """``IDEM_SPARK_MASTER``, else ``spark.master``, else ``local[*]``."""
        return spark_master_from_environment() or self.spark.master or "local[*]"

    def spark_server(self) -> str:
        """``IDEM_SPARK_SERVER`` (``auto``/``off``), else ``spark.server``.

        Raises:
            ConfigError: the variable holds anything else.
        """
        value = spark_server_from_environment() or self.spark.server
        if value not in ("auto", "off"):
            raise ConfigError(f"{SPARK_SERVER_ENV}={value!r}: expected 'auto' or 'off'")
        return value


def _migration_source(tables: dict[str, TableConfig], modules: list[str], source: Path | None) -> MigrationSource:
    """The config's migrations as an executor rebuilds them: modules, the config file's
    directory (where they may live) and every table's current version."""
    return MigrationSource(
        modules=tuple(modules),
        base_dir=str(source.parent) if source is not None else None,
        current=tuple(sorted((name, table.schema_version) for name, table in tables.items())),
    )


def _own_contracts(
    connector: ConnectorConfig, tables: dict[str, TableConfig], implicit: tuple[str, ...]
) -> dict[str, SchemaContract]:
    """The ``schema_contract`` of each record type ``connector`` writes (its fixed type, or
    every declared one when routed) whose ``tables:`` entry sets one."""
    names = (
        [connector.record_type]
        if connector.record_type is not None
        else [name for name in tables if name not in implicit]
    )
    return {
        name: contract
        for name in names
        if name in tables and (contract := tables[name].schema_contract) is not None
    }


def _own_effects(
    connector: ConnectorConfig, effects: list[EffectConfig], tables: dict[str, TableConfig], implicit: tuple[str, ...]
) -> tuple[OutboxRule, ...]:
    """The effects on the record types ``connector`` writes, as its commits apply them."""
    names = {connector.record_type} if connector.record_type is not None else set(tables) - set(implicit)
    return tuple(
        effect.rule(getattr(tables.get(effect.record_type), "mode", None) == "upsert")
        for effect in effects
        if effect.record_type in names
    )


def _str(path: Path | None) -> str | None:
    return str(path) if path is not None else None

