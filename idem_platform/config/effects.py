"""``effects:`` in ``idem.yaml``: a named outbound action on the written rows of a record type.

Everything here is declarative: the condition compares a column with constants, the body
names columns, the key names parts. Nothing read from data is ever run as code. What this
release does not build (a Python-function effect, an effect on an upsert table's changes,
results kept as a table) is refused at load, so a half-feature is never reachable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from idem_platform.config.common import NAME, ConfigModel
from idem_platform.config.tables import TableConfig
from idem_platform.contract.catalog import ColumnType
from idem_platform.effects.rule import OutboxRule

OPERATORS = ("equals", "not_equals", "in", "gt", "gte", "lt", "lte")
ORDERING = ("gt", "gte", "lt", "lte")
# Row values an effect may name besides the table's declared columns (body and key parts).
SYSTEM_PARTS = {
    "effect": None,  # the effect's own name (a key part only)
    "connector": "_connector",
    "record_type": "_record_type",
    "external_id": "_external_id",
    "content_hash": "_content_hash",
    "record_key": "_idempotency_key",
}
DEFAULT_KEY = ("effect", "connector", "record_type", "external_id", "content_hash")
CONDITION_KINDS = ("bool", "int", "long", "real", "string")
MAX_RESPONSE_CHARS = 2000


class Condition(ConfigModel):
    """``{field: confidence, gte: 80}``: one column compared with a constant (or a list, ``in``).

    A row whose column is null never meets a condition (SQL's comparison with NULL)."""

    field: str
    equals: Any = None
    not_equals: Any = None
    in_: list[Any] | None = Field(None, alias="in")
    gt: Any = None
    gte: Any = None
    lt: Any = None
    lte: Any = None

    @model_validator(mode="after")
    def _one_operator(self) -> Condition:
        given = [op for op in OPERATORS if self.value_of(op) is not None]
        if len(given) != 1:
            raise ValueError(f"a condition names one column and exactly one of {', '.join(OPERATORS)} (got {given or 'none'})")
        if self.in_ is not None and not self.in_:
            raise ValueError("'in' needs at least one value")
        return self

    def value_of(self, op: str) -> Any:
        return self.in_ if op == "in" else getattr(self, op)

    @property
    def operator(self) -> str:
        return next(op for op in OPERATORS if self.value_of(op) is not None)

    @property
    def value(self) -> Any:
        return self.value_of(self.operator)


class HttpDelivery(ConfigModel):
    """The request an effect sends: its method, URL, headers and a JSON body of named columns."""

    method: Literal["POST", "PUT", "PATCH"] = "POST"
    url: str = Field(pattern=r"^https?://", description="http:// or https:// URL")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Values may be ${ENV_VAR}: read at load, masked in every output."
    )
    body: dict[str, str] = Field(min_length=1, description="JSON field -> the row's column (or a system part).")
    timeout_seconds: float = Field(10.0, gt=0, le=300, description="Per request.")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in ("idempotency-key", "content-type", "content-length", "host"):
                raise ValueError(f"header {name!r} is set by idem, not by the config")
        return value


class EffectConfig(ConfigModel):
    """One outbound effect: on which rows (``record_type``, ``when``), what to send
    (``http``), under which key (``key``), and how hard to try (``max_attempts``, backoff)."""

    name: str = Field(pattern=f"^{NAME}$", description="[a-z0-9_-]{1,64}")
    record_type: str
    when: list[Condition] = Field(default_factory=list, description="All must hold; none: every written row.")
    key: tuple[str, ...] = Field(DEFAULT_KEY, min_length=1)
    http: HttpDelivery
    max_attempts: int = Field(5, ge=1, le=100, description="Tries in all, the first included.")
    backoff_seconds: float = Field(1.0, gt=0, description="Wait before the second try; doubles after each.")
    max_backoff_seconds: float = Field(300.0, gt=0)
    lease_seconds: float = Field(60.0, gt=0, description="How long a dispatcher's claim on a row holds.")
    python: Any = Field(None, description="Not built: refused.")
    results_table: Any = Field(None, description="Not built: refused.")

    @field_validator("when", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("python", "results_table")
    @classmethod
    def _not_built(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not available in this release: an effect is an HTTP request (http:)")
        return value

    @model_validator(mode="after")
    def _key_and_lease(self) -> EffectConfig:
        if "effect" not in self.key:
            raise ValueError("key must include 'effect' (two effects on one row never share a key)")
        if self.lease_seconds <= self.http.timeout_seconds:
            raise ValueError(
                f"lease_seconds ({self.lease_seconds:g}) must be longer than http.timeout_seconds "
                f"({self.http.timeout_seconds:g}): a claim must outlive the request it covers"
            )
        return self

    def check_against(self, tables: dict[str, TableConfig]) -> None:
        """Check the record type, columns and constants against ``tables:``.

        Raises:
            ValueError: naming the key at fault.
        """
        table = tables.get(self.record_type)
        if table is None:
            raise ValueError(f"record_type {self.record_type!r} is not in tables ({', '.join(sorted(tables)) or 'none'})")
        if getattr(table, "mode", None) not in (None, "append"):
            raise ValueError("effects on an upsert table's changes are not available in this release")
        kinds = {name: ColumnType.parse(column.type).kind for name, column in table.columns.items()}
        for condition in self.when:
            _check_condition(condition, kinds)
        for field, column in self.http.body.items():
            if column not in kinds and column not in SYSTEM_PARTS or column == "effect":
                raise ValueError(f"http.body.{field}: {column!r} is neither a column of {self.record_type} nor one of "
                                 f"{', '.join(sorted(set(SYSTEM_PARTS) - {'effect'}))}")
        for part in self.key:
            if part not in kinds and part not in SYSTEM_PARTS:
                raise ValueError(f"key part {part!r} is neither a column of {self.record_type} nor one of "
                                 f"{', '.join(sorted(SYSTEM_PARTS))}")

    def rule(self) -> OutboxRule:
        """What the commit needs of this effect (no URL, no headers: no secret travels with a plan)."""
        return OutboxRule(
            name=self.name,
            record_type=self.record_type,
            when=tuple((c.field, c.operator, _frozen(c.value)) for c in self.when),
            body=tuple(self.http.body.items()),
            key=self.key,
        )


def _check_condition(condition: Condition, kinds: dict[str, str]) -> None:
    kind = kinds.get(condition.field)
    if kind is None:
        raise ValueError(f"when: {condition.field!r} is not a declared column ({', '.join(sorted(kinds)) or 'none'})")
    if kind not in CONDITION_KINDS:
        raise ValueError(f"when: {condition.field!r} is a {kind} column; conditions compare {', '.join(CONDITION_KINDS)} columns")
    op = condition.operator
    if kind == "bool" and op in ORDERING:
        raise ValueError(f"when: {condition.field!r} is a bool column: use equals, not_equals or in")
    values = condition.value if op == "in" else [condition.value]
    for value in values:
        if not _fits(kind, value):
            raise ValueError(f"when: {value!r} is not a {kind} value (column {condition.field!r})")


def _fits(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind in ("int", "long"):
        return isinstance(value, int)
    if kind == "real":
        return isinstance(value, (int, float))
    return isinstance(value, str)


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def check_effects(effects: list[EffectConfig], tables: dict[str, TableConfig]) -> None:
    """Names are unique and every effect fits its table.

    Raises:
        ValueError: ``effects[i]: ...``.
    """
    seen: set[str] = set()
    for index, effect in enumerate(effects):
        if effect.name in seen:
            raise ValueError(f"effects[{index}]: effect name {effect.name!r} is used twice")
        seen.add(effect.name)
        try:
            effect.check_against(tables)
        except ValueError as exc:
            raise ValueError(f"effects[{index}] ({effect.name}): {exc}") from None
