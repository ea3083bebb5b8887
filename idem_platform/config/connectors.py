"""``connectors:``: the sources of records, and how their records become rows.

One model per ``kind`` (:class:`FileDropConnector`, :class:`KafkaConnector`,
:class:`HttpConnector`, :class:`OtlpConnector`), so a key exists only on the kinds that
use it and code that reads ``topics`` or ``path`` has to know which kind it holds.
:data:`ConnectorConfig` is their union, told apart by ``kind``; a key of another kind is
refused by name (``topics: only for kind: kafka connectors``), not as an unknown key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from idem_platform.config.common import CONTRACT_HELP, NAME, ConfigModel, SchemaContract
from idem_platform.effects.rule import OutboxRule
from idem_platform.migrations import MigrationSource

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
KINDS = ("filedrop", "kafka", "http", "otlp")
"""Every connector ``kind``, in the order messages list them."""

DEFAULT_SENSOR_INTERVAL_SECONDS = 15
"""A filedrop or kafka connector's default ``sensor_interval_seconds``."""
PUSH_SENSOR_INTERVAL_SECONDS = 5
"""An http/otlp connector's default ``sensor_interval_seconds``: a pushed body is complete
when it lands (its sensor does not wait for a second look), so the tick interval is all
that stands between its ``202`` and its run."""


class ConnectorBase(ConfigModel):
    """What every kind of connector has: its name, how records are routed to tables and
    keyed, the schema contract, reject and slicing limits, and its sensor's pace."""

    default_contract: ClassVar[SchemaContract] = "evolve"

    name: str = Field(pattern=f"^{NAME}$", description="[a-z0-9_-]{1,64}")
    record_type_field: str | None = Field(None, description="Field whose value names the table.")
    record_type: str | None = Field(None, description="One fixed record type for every record.")
    id_field: str = Field("id", description="Field holding the record's external id.")
    schema_contract: SchemaContract | None = Field(
        None,
        description=f"{CONTRACT_HELP} Default: evolve, drop for kafka; a record type's own "
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
        DEFAULT_SENSOR_INTERVAL_SECONDS,
        ge=1,
        description="Seconds between two ticks of the connector's sensor (at least). Default 15; "
        f"{PUSH_SENSOR_INTERVAL_SECONDS} for http/otlp connectors, whose bodies land whole and run on the "
        "first tick that sees them.",
    )
    max_attempts: int = Field(3, ge=1, description="Automatic sensor retries of a failed file.")
    key_namespace: str | None = Field(
        None,
        pattern=f"^{NAME}$",
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
    # Set by IdemConfig from the rest of the file, never read from it (see _set_by_config).
    table_contracts: dict[str, SchemaContract] = Field(
        default_factory=dict,
        exclude=True,
        repr=False,
        description="Record type -> the schema_contract its tables: entry sets, for the record types "
        "this connector writes that set one.",
    )
    migrations: MigrationSource = Field(
        default_factory=MigrationSource,
        exclude=True,
        repr=False,
        description="The config's migration modules and current versions: what the executors that "
        "coerce this connector's records import to upgrade a record older than its table.",
    )

    @property
    def identifier(self) -> str:
        """The connector's one spelling in Dagster: its name with ``-`` as ``_``.

        Dagster's group, job, op and sensor names take no ``-`` while asset keys do, so
        ``threatfeed-push`` used to show as two spellings in the UI; every Dagster name of
        the connector (asset key prefix, group, job, ops, sensor, partitions) now uses this
        one, and :class:`~idem_platform.config.IdemConfig` refuses two connectors sharing it.
        What idem stores (ledger rows, record keys, the ``idem/connector`` tag) and what the
        CLI and ``idem serve`` accept keep the name as written in ``idem.yaml``."""
        return self.name.replace("-", "_")

    effects: tuple[OutboxRule, ...] = Field(
        (),
        exclude=True,
        repr=False,
        description="The effects on the record types this connector writes (the file's effects:).",
    )

    @field_validator("table_contracts", "migrations", "effects", mode="before")
    @classmethod
    def _set_by_config(cls, value: Any) -> Any:
        """Refuse these as keys of ``idem.yaml`` (they are the file's ``tables:`` and
        ``migrations:`` as one connector sees them): :class:`IdemConfig` sets them on the
        connectors it validated, by copy, which does not come through here."""
        raise PydanticCustomError("extra_forbidden", "Extra inputs are not permitted")

    @field_validator("schema_evolve")
    @classmethod
    def _one_contract_key(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value is not None and info.data.get("schema_contract") is not None:
            raise ValueError(
                "schema_evolve and schema_contract are both set; keep one (schema_evolve is the older "
                "spelling: true is schema_contract: evolve, false is schema_contract: drop)"
            )
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _checked(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """Validate this kind's keys, then the rules across keys (:meth:`_problem`), then
        refuse the keys of other kinds by name. A key of another kind is held back from the
        field validation so it reads ``topics: only for kind: kafka connectors`` rather than
        "extra inputs are not permitted", and comes last, after the errors of the keys
        this kind does have, as in one flat model."""
        foreign = _foreign_keys(cls, data)
        connector = handler({k: v for k, v in data.items() if k not in foreign} if foreign else data)
        problem = connector._problem() or _foreign_problem(foreign)
        if problem is not None:
            raise ValueError(problem)
        return connector

    def _problem(self) -> str | None:
        """What is wrong across keys (one message), or None; kinds add their own rules."""
        if (self.record_type is None) == (self.record_type_field is None):
            return "set exactly one of 'record_type' (fixed) or 'record_type_field'"
        return None

    @property
    def sensor_interval(self) -> int:
        """Seconds between sensor ticks (``sensor_interval_seconds``, whose default is the kind's)."""
        return self.sensor_interval_seconds

    @property
    def lands_files(self) -> bool:
        """Whether the connector's records arrive as files in ``path`` (filedrop, and the
        HTTP kinds, whose bodies ``idem serve`` lands there): the file-drop sensor and
        assets run it. Code that reads ``path`` narrows with ``isinstance(c, FileConnectorBase)``."""
        return isinstance(self, FileConnectorBase)

    @property
    def contract(self) -> SchemaContract:
        """The connector's schema contract (DESIGN §3): ``schema_contract``, else what
        ``schema_evolve`` means, else the kind's default (``evolve``; ``drop`` for kafka)."""
        if self.schema_contract is not None:
            return self.schema_contract
        if self.schema_evolve is not None:
            return "evolve" if self.schema_evolve else "drop"
        return self.default_contract

    def contract_for(self, record_type: str) -> SchemaContract:
        """The schema contract of one record type this connector writes: the type's own
        ``schema_contract`` (in ``tables:``) wins over the connector's."""
        return self.table_contracts.get(record_type, self.contract)

    @property
    def evolve(self) -> bool:
        """Whether unknown fields may widen a table this connector writes (its contract, or
        one of its record types' own, is ``evolve``)."""
        return self.contract == "evolve" or "evolve" in self.table_contracts.values()

    @property
    def key_prefix(self) -> str:
        """The first part of this connector's record keys."""
        return self.key_namespace or self.name

    @property
    def meta_column(self) -> str | None:
        """The table column that keeps the records' source metadata, if any (only Kafka's)."""
        return None

    @property
    def debezium(self) -> bool:
        """Whether the records are Debezium change events (``format: debezium``: filedrop, kafka)."""
        return getattr(self, "format", "json") == "debezium"

    def _debezium_problem(self) -> str | None:
        """A Debezium connector writes one fixed record type (an upsert table keyed by the row's
        primary key) and states no schema_version (the row image is the table's current shape)."""
        if not self.debezium:
            return None
        if self.record_type is None:
            return "format: debezium needs a fixed 'record_type' (the upsert table the change events keep current)"
        if self.schema_version is not None:
            return "format: debezium takes no 'schema_version' (a row image is at its table's current version)"
        return None


_FORMAT_HELP = (
    "json: each record is a JSON object; debezium: each record is a Debezium change event "
    "(docs/kafka.md): its row image is the version, op d deletes, the source position orders "
    "(source.lsn; a MySQL event's binlog file, pos and row)."
)


class FileConnectorBase(ConnectorBase):
    """A connector whose records arrive as files in ``path``: dropped there (filedrop) or
    landed there by ``idem serve`` (http, otlp). The file-drop sensor batches them."""

    needs_path: ClassVar[str]  # the message when ``path`` is missing: what the directory is for

    path: Path | None = Field(
        None, description="filedrop: the watched directory; http/otlp: the directory idem serve lands bodies in."
    )
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

    def _problem(self) -> str | None:
        if (problem := super()._problem()) is not None:
            return problem
        return self.needs_path if self.path is None else None


class FileDropConnector(FileConnectorBase):
    """``kind: filedrop``: files you drop in ``path``."""

    needs_path: ClassVar[str] = "a filedrop connector needs 'path' (the watched directory)"

    kind: Literal["filedrop"] = "filedrop"
    format: Literal["json", "debezium"] = Field("json", description=f"filedrop, kafka: {_FORMAT_HELP}")

    def _problem(self) -> str | None:
        return super()._problem() or self._debezium_problem()


class PushConnectorBase(FileConnectorBase):
    """A connector ``idem serve`` receives bodies for over HTTP and lands in ``path``."""

    sensor_interval_seconds: int = Field(
        PUSH_SENSOR_INTERVAL_SECONDS,
        ge=1,
        description="Seconds between two ticks of the connector's sensor (at least). Default "
        f"{PUSH_SENSOR_INTERVAL_SECONDS}: bodies land whole and run on the first tick that sees them.",
    )
    max_body_bytes: int = Field(
        64 << 20, ge=1024, description="http/otlp: larger request bodies are refused (413)."
    )


class HttpConnector(PushConnectorBase):
    """``kind: http``: JSON bodies POSTed to ``idem serve``."""

    needs_path: ClassVar[str] = "an http connector needs 'path' (the directory idem serve lands request bodies in)"

    kind: Literal["http"] = "http"


class OtlpConnector(PushConnectorBase):
    """``kind: otlp``: OpenTelemetry logs POSTed to ``idem serve`` (IdemConfig gives it its
    ``log`` record type and ``missing_id: content``)."""

    needs_path: ClassVar[str] = "an otlp connector needs 'path' (the directory idem serve lands request bodies in)"

    kind: Literal["otlp"] = "otlp"


class KafkaConnector(ConnectorBase):
    """``kind: kafka``: every partition of ``topics``, read in offset ranges."""

    default_contract: ClassVar[SchemaContract] = "drop"

    kind: Literal["kafka"] = "kafka"
    format: Literal["json", "debezium"] = Field("json", description=f"filedrop, kafka: {_FORMAT_HELP}")
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

    def _problem(self) -> str | None:
        if (problem := super()._problem()) is not None:
            return problem
        if not self.bootstrap_servers:
            return "a kafka connector needs 'bootstrap_servers' (host:port, or ${KAFKA_BOOTSTRAP_SERVERS})"
        if not self.topics:
            return "a kafka connector needs 'topics' (a list of topic names)"
        if len(set(self.topics)) != len(self.topics):
            return "a topic is listed twice in 'topics'"
        return self._debezium_problem()

    @property
    def group(self) -> str:
        """The Kafka consumer group offsets are mirrored to."""
        return self.consumer_group or f"idem-{self.name}"

    @property
    def meta_column(self) -> str | None:
        """``_kafka`` (each message's key, headers and timestamp), unless ``kafka_metadata: ignore``."""
        return "_kafka" if self.kafka_metadata == "include" else None


ConnectorConfig = Annotated[
    FileDropConnector | KafkaConnector | HttpConnector | OtlpConnector, Field(discriminator="kind")
]
"""Any connector, validated as the model its ``kind`` names (and only that model's errors shown)."""
FileConnector = FileDropConnector | HttpConnector | OtlpConnector
"""A connector whose records arrive as files in ``path`` (``isinstance(c, FileConnectorBase)``)."""
PushConnector = HttpConnector | OtlpConnector
"""A connector ``idem serve`` receives bodies for (``isinstance(c, PushConnectorBase)``)."""

_KIND_MODELS: tuple[type[ConnectorBase], ...] = (FileDropConnector, KafkaConnector, HttpConnector, OtlpConnector)


def _foreign_keys(model: type[ConnectorBase], data: Any) -> list[str]:
    """The keys of ``data`` that ``model`` lacks but another kind has (sorted)."""
    if not isinstance(data, dict):
        return []
    others = {name for kind in _KIND_MODELS for name in kind.model_fields}
    return sorted(key for key in data if key not in model.model_fields and key in others)


def _foreign_problem(keys: list[str]) -> str | None:
    """``topics, client_config: only for kind: kafka connectors``: the keys of the kinds
    with the most owners first (a key of the three file kinds, then http/otlp's, then Kafka's)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for key in keys:
        owners = tuple(kind.model_fields["kind"].default for kind in _KIND_MODELS if key in kind.model_fields)
        groups.setdefault(tuple(sorted(owners, key=KINDS.index)), []).append(key)
    if not groups:
        return None
    owners, names = max(groups.items(), key=lambda item: len(item[0]))
    listed = ", ".join(owners[:-1]) + f" and {owners[-1]}" if len(owners) > 1 else owners[0]
    return f"{', '.join(names)}: only for kind: {listed} connectors"
