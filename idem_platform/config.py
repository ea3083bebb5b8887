"""``idem.yaml``: the one file that declares connectors, tables, migrations and Spark.

Parsed into typed pydantic models. Every error names the file, the dotted key
(``connectors[0].max_reject_ratio``), its line when known, and what is wrong, so
a user can fix the file without reading our code. ``${VAR}`` and
``${VAR:-default}`` in string values are resolved from the environment at load.
Relative paths are relative to the file itself, not to the working directory.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from idem_platform.contract.catalog import (
    MAX_IDENTIFIER_BYTES,
    POSTGRES_SYSTEM_COLUMNS,
    RESERVED_TABLE_NAMES,
    Column,
    ColumnType,
    TableSpec,
    is_safe_column_name,
)
from idem_platform.contract.keys import NAME_PATTERN
from idem_platform.contract.otlp_logs import DEFAULT_LOG_RECORD_TYPE, LOG_COLUMNS
from idem_platform.errors import ConfigError
from idem_platform.migrations import Chains, MigrationChainError, MigrationSource
from idem_platform.redact import remember_settings

CONFIG_ENV = "IDEM_CONFIG"
SPARK_MASTER_ENV = "IDEM_SPARK_MASTER"
SPARK_SERVER_ENV = "IDEM_SPARK_SERVER"  # auto | off: overrides spark.server
SPARK_REMOTE_ENV = "IDEM_SPARK_REMOTE"  # sc://host:port of a Spark Connect server (idem spark start)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = NAME_PATTERN.pattern
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# librdkafka settings idem owns: exactly-once reading depends on them.
MANAGED_KAFKA_SETTINGS = {
    "bootstrap.servers": "from bootstrap_servers",
    "group.id": "from consumer_group",
    "enable.auto.commit": "offsets live in PostgreSQL",
    "enable.auto.offset.store": "offsets live in PostgreSQL",
    "auto.offset.reset": "a missing offset is an error, never a silent jump",
    "isolation.level": "read_committed, always",
    "enable.partition.eof": "ranges end at their planned offset",
}
# What a record's unknown top-level fields do (DESIGN §3): widen the table, reject the row,
# or stay in ``_payload`` only.
SchemaContract = Literal["evolve", "strict", "drop"]
_CONTRACT_HELP = (
    "What unknown top-level fields do: evolve (new nullable text columns, unsafe names to props), "
    "strict (the row is a reject naming them) or drop (kept only in _payload)."
)
_KAFKA_ONLY = (
    "bootstrap_servers", "topics", "consumer_group", "client_config", "max_records_per_run",
    "split_records", "start_offset", "offset_gap", "kafka_metadata", "read_timeout_seconds",
)


PUSH_SENSOR_INTERVAL_SECONDS = 5
"""An http/otlp connector's default ``sensor_interval_seconds``."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnConfig(_Model):
    """A column: ``confidence: int`` or ``name: {type: string, required: true}``."""

    type: str
    required: bool = False

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        ColumnType.parse(value)
        return value


class TableConfig(_Model):
    """A record type's table (``idem.<record_type>``)."""

    schema_version: int = Field(1, ge=1, description="Bumped only on breaking changes.")
    columns: dict[str, ColumnConfig] = Field(default_factory=dict)
    schema_contract: SchemaContract | None = Field(
        None, description=f"{_CONTRACT_HELP} Wins over the connector's; default: the connector's."
    )

    @field_validator("columns", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {"type": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("columns")
    @classmethod
    def _column_names(cls, value: dict[str, ColumnConfig]) -> dict[str, ColumnConfig]:
        for name in value:
            if not is_safe_column_name(name):
                raise ValueError(
                    f"column name {name!r} must match ^[a-z_][a-z0-9_]{{0,62}}$ and must not "
                    "start with '_' or be 'props' or one of PostgreSQL's system columns "
                    f"({', '.join(sorted(POSTGRES_SYSTEM_COLUMNS))})"
                )
        return value


class ConnectorConfig(_Model):
    """One source of records and how its records become rows."""

    name: str = Field(pattern=f"^{_NAME}$", description="[a-z0-9_-]{1,64}")
    kind: Literal["filedrop", "kafka", "http", "otlp"]
    path: Path | None = Field(
        None, description="filedrop: the watched directory; http/otlp: the directory idem serve lands bodies in."
    )
    record_type_field: str | None = Field(None, description="Field whose value names the table.")
    record_type: str | None = Field(None, description="One fixed record type for every record.")
    id_field: str = Field("id", description="Field holding the record's external id.")
    schema_contract: SchemaContract | None = Field(
        None,
        description=f"{_CONTRACT_HELP} Default: evolve, drop for kafka; a record type's own "
        "schema_contract (in tables:) wins.",
    )
    schema_evolve: bool | None = Field(
        None, description="Older spelling of schema_contract: true is evolve, false is drop."
    )
    missing_id: Literal["position", "content", "reject"] = "position"
    max_reject_ratio: float = Field(1.0, ge=0.0, le=1.0)
    max_line_bytes: int = Field(1 << 20, ge=64, description="Longer lines are rejects.")
    split_bytes: int = Field(
        64 << 20,
        ge=1 << 16,
        description=(
            "At most this many bytes per Spark read slice (one task). Slices are planned over the "
            "whole batch: about 8 per batch, smaller at the tail, several small files per slice."
        ),
    )
    sensor_interval_seconds: int = Field(
        15,
        ge=1,
        description="Seconds between two ticks of the connector's sensor (at least). Default 15; "
        f"{PUSH_SENSOR_INTERVAL_SECONDS} for http/otlp connectors, whose bodies land whole and run on the "
        "first tick that sees them.",
    )
    max_attempts: int = Field(3, ge=1, description="Automatic sensor retries of a failed file.")
    max_files_per_run: int = Field(
        500,
        ge=1,
        description="filedrop/http/otlp: the sensor commits up to this many new settled files in one run "
        "(one transaction, each file keeping its ledger key and partition); 1 = one run per file. "
        "Retries of a failed batch's files run one file per run.",
    )
    max_bytes_per_run: int = Field(
        1 << 30,
        ge=1,
        description="filedrop/http/otlp: bytes of new files one sensor run may take (default 1 GiB); "
        "a larger file runs alone.",
    )
    key_namespace: str | None = Field(
        None,
        pattern=f"^{_NAME}$",
        description="First part of every record key (default: the connector's name). Connectors of "
        "one feed that share it (a Kafka topic and its file exports) write each record once.",
    )
    schema_version: int | None = Field(
        None,
        ge=1,
        description="The schema_version of the records this connector receives, when they do not say "
        "(default: each table's current one). Older records are upgraded through the migrations.",
    )
    schema_version_field: str = Field(
        "schema_version",
        min_length=1,
        description="The record field that states the record's own schema_version (a system field: "
        "never a column, never in props).",
    )
    # HTTP push (kind: http | otlp)
    max_body_bytes: int = Field(
        64 << 20, ge=1024, description="http/otlp: larger request bodies are refused (413)."
    )
    # Kafka (kind: kafka)
    bootstrap_servers: str | None = Field(None, description="kafka: host:port[,host:port...]")
    topics: list[str] | None = Field(None, description="kafka: the topics read, every partition.")
    consumer_group: str | None = Field(
        None, description="kafka: group the committed offsets are mirrored to for lag tools (default idem-<name>)."
    )
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="kafka: librdkafka settings for every client (security.protocol, sasl.*, ssl.*, ...).",
        repr=False,  # sasl.password, ssl.key.password: never in a repr an error or a log may print
    )
    max_records_per_run: int | None = Field(None, ge=1, description="kafka: at most this many offsets per run.")
    split_records: int = Field(100_000, ge=1000, description="kafka: most offsets one Spark task reads.")
    start_offset: Literal["earliest", "latest"] = Field(
        "earliest", description="kafka: where a partition with no committed offset starts."
    )
    offset_gap: Literal["fail", "skip"] = Field(
        "fail",
        description="kafka: when retention deleted messages past the committed offset: fail, or skip "
        "them (the gap is recorded in idem.commits.sources).",
    )
    kafka_metadata: Literal["include", "ignore"] = Field(
        "include", description="kafka: keep each message's key, headers and timestamp in the _kafka column."
    )
    read_timeout_seconds: float = Field(
        60.0, gt=0, description="kafka: a task fails when its range stops advancing for this long."
    )
    # Record type -> the schema_contract its ``tables:`` entry sets (IdemConfig fills it in).
    _table_contracts: dict[str, SchemaContract] = PrivateAttr(default_factory=dict)
    # The config's migrations, for the executors that upgrade old records (IdemConfig fills it in).
    _migrations: MigrationSource = PrivateAttr(default_factory=MigrationSource)

    @field_validator("schema_evolve")
    @classmethod
    def _one_contract_key(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value is not None and info.data.get("schema_contract") is not None:
            raise ValueError(
                "schema_evolve and schema_contract are both set; keep one (schema_evolve is the older "
                "spelling: true is schema_contract: evolve, false is schema_contract: drop)"
            )
        return value

    @field_validator("client_config", mode="before")
    @classmethod
    def _client_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key in value:
                if key in MANAGED_KAFKA_SETTINGS:
                    raise ValueError(f"{key!r} is set by idem ({MANAGED_KAFKA_SETTINGS[key]}); remove it")
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str] | None) -> list[str] | None:
        for topic in value or []:
            if not _TOPIC.fullmatch(topic):
                raise ValueError(f"topic {topic!r} is not a Kafka topic name ([a-zA-Z0-9._-]{{1,249}})")
        return value

    @model_validator(mode="after")
    def _routing(self) -> ConnectorConfig:
        if (self.record_type is None) == (self.record_type_field is None):
            raise ValueError("set exactly one of 'record_type' (fixed) or 'record_type_field'")
        if self.lands_files and self.path is None:
            raise ValueError(
                "a filedrop connector needs 'path' (the watched directory)"
                if self.kind == "filedrop"
                else f"an {self.kind} connector needs 'path' (the directory idem serve lands request bodies in)"
            )
        if "max_body_bytes" in self.model_fields_set and self.kind not in ("http", "otlp"):
            raise ValueError("max_body_bytes: only for kind: http and otlp connectors")
        if self.kind == "kafka":
            if not self.bootstrap_servers:
                raise ValueError("a kafka connector needs 'bootstrap_servers' (host:port, or ${KAFKA_BOOTSTRAP_SERVERS})")
            if not self.topics:
                raise ValueError("a kafka connector needs 'topics' (a list of topic names)")
            if len(set(self.topics)) != len(self.topics):
                raise ValueError("a topic is listed twice in 'topics'")
        else:
            wrong = sorted(name for name in _KAFKA_ONLY if name in self.model_fields_set)
            if wrong:
                raise ValueError(f"{', '.join(wrong)}: only for kind: kafka connectors")
        return self

    @property
    def sensor_interval(self) -> int:
        """Seconds between sensor ticks: ``sensor_interval_seconds`` when set, else 15, or
        :data:`PUSH_SENSOR_INTERVAL_SECONDS` for http/otlp. A pushed body is complete when it
        lands (its sensor does not wait for a second look), so the tick interval is all
        that stands between its ``202`` and its run."""
        if "sensor_interval_seconds" in self.model_fields_set or self.kind not in ("http", "otlp"):
            return self.sensor_interval_seconds
        return PUSH_SENSOR_INTERVAL_SECONDS

    @property
    def lands_files(self) -> bool:
        """Whether the connector's records arrive as files in ``path`` (filedrop, and the
        HTTP kinds, whose bodies ``idem serve`` lands there): the file-drop sensor and
        assets run it."""
        return self.kind in ("filedrop", "http", "otlp")

    @property
    def contract(self) -> SchemaContract:
        """The connector's schema contract (DESIGN §3): ``schema_contract``, else what
        ``schema_evolve`` means, else ``evolve`` (``drop`` for kafka)."""
        if self.schema_contract is not None:
            return self.schema_contract
        if self.schema_evolve is not None:
            return "evolve" if self.schema_evolve else "drop"
        return "drop" if self.kind == "kafka" else "evolve"

    def contract_for(self, record_type: str) -> SchemaContract:
        """The schema contract of one record type this connector writes: the type's own
        ``schema_contract`` (in ``tables:``) wins over the connector's."""
        return self._table_contracts.get(record_type, self.contract)

    @property
    def evolve(self) -> bool:
        """Whether unknown fields may widen a table this connector writes (its contract, or
        one of its record types' own, is ``evolve``)."""
        return self.contract == "evolve" or "evolve" in self._table_contracts.values()

    @property
    def migrations(self) -> MigrationSource:
        """The config's migration modules and current versions (what executors import to upgrade
        a record older than its table)."""
        return self._migrations

    @property
    def key_prefix(self) -> str:
        """The first part of this connector's record keys."""
        return self.key_namespace or self.name

    @property
    def group(self) -> str:
        """The Kafka consumer group offsets are mirrored to."""
        return self.consumer_group or f"idem-{self.name}"

    @property
    def meta_column(self) -> str | None:
        """The table column that keeps the records' source metadata, if any."""
        return "_kafka" if self.kind == "kafka" and self.kafka_metadata == "include" else None


class SparkConfig(_Model):
    """How to reach Spark; ``IDEM_SPARK_MASTER`` overrides ``master``."""

    master: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)
    server: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "`idem ingest` (and `idem demo`): `auto` runs on the long-lived Spark Connect server under "
            "<idem home>/spark when one is up for this master, settings and code (`idem spark start` "
            "starts it, `idem spark stop` stops it; `idem dev` runs one while it runs), so runs skip the "
            "JVM start; no run starts one itself. `off` always starts Spark in each run's own process. "
            "IDEM_SPARK_SERVER overrides; a named server (spark.conf's spark.remote, IDEM_SPARK_REMOTE) "
            "is always used."
        ),
    )

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value


class IdemConfig(_Model):
    """The whole ``idem.yaml``."""

    connectors: list[ConnectorConfig] = Field(default_factory=list)
    tables: dict[str, TableConfig] = Field(default_factory=dict)
    migrations: list[str] = Field(default_factory=list)
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
    implicit_tables: tuple[str, ...] = Field(
        (), exclude=True, description="Tables no `tables:` entry declared (an otlp connector's log type)."
    )

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
            if name in RESERVED_TABLE_NAMES:
                raise ValueError(
                    f"record type {name!r} is the name of one of idem's own tables in schema idem "
                    f"({', '.join(sorted(RESERVED_TABLE_NAMES))}): pick another"
                )
        return value

    @model_validator(mode="after")
    def _references(self) -> IdemConfig:
        seen: dict[str, str] = {}
        for connector in self.connectors:
            # Dagster names (jobs, sensors, groups) turn '-' into '_': feed-a and feed_a would clash.
            name = connector.name.replace("-", "_")
            if name in seen:
                other = seen[name]
                raise ValueError(
                    f"connector name {connector.name!r} is used twice"
                    if other == connector.name
                    else f"connector names {other!r} and {connector.name!r} name the same Dagster job and sensor "
                    "('-' and '_' are one character there); rename one"
                )
            seen[name] = connector.name
            if connector.record_type is not None and connector.record_type not in self.tables:
                raise ValueError(
                    f"connector {connector.name!r}: record_type {connector.record_type!r} is not "
                    f"in tables ({', '.join(sorted(self.tables)) or 'none declared'})"
                )
            self._check_versions(connector)
        return self

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

    @model_validator(mode="after")
    def _share_migrations(self, info: ValidationInfo) -> IdemConfig:
        """Hand each connector the config's migrations (:attr:`ConnectorConfig.migrations`): the
        executors that coerce its records import them to upgrade old ones. The config file's
        directory comes from the validation context (:func:`parse_config` passes it)."""
        source = (info.context or {}).get("source") if isinstance(info.context, dict) else None
        shared = self._migration_source(Path(source) if source is not None else None)
        for connector in self.connectors:
            connector._migrations = shared
        return self

    def _migration_source(self, source: Path | None) -> MigrationSource:
        return MigrationSource(
            modules=tuple(self.migrations),
            base_dir=str(source.parent) if source is not None else None,
            current=tuple(sorted((name, table.schema_version) for name, table in self.tables.items())),
        )

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
        from idem_platform.migrations import check_chains, load_modules

        where = _str(self.source)
        try:
            load_modules(self.migrations, self.source.parent if self.source is not None else None)
            return check_chains(dict(self._migration_source(self.source).current), self.migrations)
        except MigrationChainError as exc:
            raise MigrationChainError(" ".join(str(exc).split("\n  ")), path=where, key="migrations") from None
        except ConfigError as exc:
            raise ConfigError(str(exc), path=where, key="migrations") from exc

    @model_validator(mode="after")
    def _contracts(self) -> IdemConfig:
        """Hand each connector the ``schema_contract`` of the record types it writes that set
        their own (:meth:`ConnectorConfig.contract_for`)."""
        for connector in self.connectors:
            names = (
                [connector.record_type]
                if connector.record_type is not None
                else [name for name in self.tables if name not in self.implicit_tables]
            )
            connector._table_contracts = {
                name: contract
                for name in names
                if name in self.tables and (contract := self.tables[name].schema_contract) is not None
            }
        return self

    @cached_property
    def table_specs(self) -> dict[str, TableSpec]:
        """The declared tables as catalog specs."""
        return {
            name: TableSpec(
                name,
                table.schema_version,
                tuple(
                    Column(col, ColumnType.parse(cfg.type), cfg.required)
                    for col, cfg in table.columns.items()
                ),
            )
            for name, table in self.tables.items()
        }

    def connector(self, name: str) -> ConnectorConfig:
        """The connector called ``name``.

        Raises:
            ConfigError: naming the connectors that exist.
        """
        for connector in self.connectors:
            if connector.name == name:
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
        return os.environ.get(SPARK_MASTER_ENV) or self.spark.master or "local[*]"

    def spark_server(self) -> str:
        """``IDEM_SPARK_SERVER`` (``auto``/``off``), else ``spark.server``.

        Raises:
            ConfigError: the variable holds anything else.
        """
        value = os.environ.get(SPARK_SERVER_ENV, "").strip().lower() or self.spark.server
        if value not in ("auto", "off"):
            raise ConfigError(f"{SPARK_SERVER_ENV}={value!r}: expected 'auto' or 'off'")
        return value


def _str(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def _resolve_env(value: Any, where: str, path: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_env(v, f"{where}.{k}" if where else str(k), path) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, f"{where}[{i}]", path) for i, v in enumerate(value)]
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"environment variable {name} is not set", path=path, key=where)

        return _ENV_REF.sub(substitute, value)
    return value


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or its nearest parent)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
        else:
            nxt = None
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (the last would win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, path: Path | None = None) -> IdemConfig:
    """Parse the text of an ``idem.yaml``.

    Raises:
        ConfigError: for YAML syntax, unknown keys, wrong types, bad names, unset
            environment variables and dangling references; the message names the
            file, the key and its line.
    """
    where = str(path) if path else "idem.yaml"
    try:
        root = yaml.compose(text)
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"not valid YAML{at}: {exc.problem or exc.context}", path=where) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", path=where) from None
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping (connectors:, tables:, ...)", path=where)
    data = _resolve_env(data, "", where)
    base = path.parent if path else Path.cwd()
    connectors = data.get("connectors")
    for connector in connectors if isinstance(connectors, list) else []:
        if isinstance(connector, dict) and isinstance(connector.get("path"), str):
            connector["path"] = str((base / connector["path"]).resolve())
    try:
        config = IdemConfig.model_validate(data, context={"source": path})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            line = _line_of(root, loc)
            key = _dotted(loc) or "(top level)"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{key}{f' (line {line})' if line else ''}: {message}")
        raise ConfigError("; ".join(problems), path=where) from None
    for connector in config.connectors:
        # From here on, no message of this process shows these credentials (idem_platform.redact).
        remember_settings(connector.client_config)
    return config.model_copy(update={"source": path})


def load_config(path: str | Path | None = None) -> IdemConfig:
    """Load ``idem.yaml`` from ``path``, else ``$IDEM_CONFIG``, else ``./idem.yaml``.

    Raises:
        ConfigError: the file is missing or invalid.
    """
    chosen = path or os.environ.get(CONFIG_ENV) or "idem.yaml"
    resolved = Path(chosen).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(
            f"config file not found: {resolved} (pass --config PATH or set {CONFIG_ENV})"
        )
    try:
        text = resolved.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})", path=str(resolved)) from None
    return parse_config(text, resolved)
