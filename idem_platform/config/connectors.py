"""``connectors:``: the sources of records, and how their records become rows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from idem_platform.config.common import CONTRACT_HELP, NAME, ConfigModel, SchemaContract
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
_KAFKA_ONLY = (
    "bootstrap_servers", "topics", "consumer_group", "client_config", "max_records_per_run",
    "split_records", "start_offset", "offset_gap", "kafka_metadata", "read_timeout_seconds",
)


PUSH_SENSOR_INTERVAL_SECONDS = 5
"""An http/otlp connector's default ``sensor_interval_seconds``."""


class ConnectorConfig(ConfigModel):
    """One source of records and how its records become rows."""

    name: str = Field(pattern=f"^{NAME}$", description="[a-z0-9_-]{1,64}")
    kind: Literal["filedrop", "kafka", "http", "otlp"]
    path: Path | None = Field(
        None, description="filedrop: the watched directory; http/otlp: the directory idem serve lands bodies in."
    )
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
