"""``effects:`` in ``idem.yaml``: a named outbound action on the written rows of a record type.

Everything here is declarative: the condition compares a column with constants, the body
names columns, the key names parts. Nothing read from data is ever run as code: a
Python-function effect names a function of a module the config lists (``effect_modules:``),
imported and checked at load. An effect on an upsert table (``mode: upsert``) fires on
what a commit did to the current state (``on_change``), never on history-only versions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from idem_platform.config.common import NAME, ConfigModel
from idem_platform.config.tables import TableConfig
from idem_platform.contract.catalog import (
    RESERVED_TABLE_NAMES,
    ColumnType,
    table_name,
    upsert_relations,
)
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
    "change": "_change",  # inserted, updated or deleted: an upsert table's effects only
}
DEFAULT_KEY = ("effect", "connector", "record_type", "external_id", "content_hash")
# An upsert table's effect: the change kind too, so one version never owes two rows.
DEFAULT_UPSERT_KEY = ("effect", "connector", "record_type", "external_id", "change", "content_hash")
CHANGES = ("inserted", "updated", "deleted")
DEFAULT_CHANGES = ("inserted", "updated")
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
            if name.lower() in ("idempotency-key", "content-length", "host"):
                raise ValueError(f"header {name!r} is set by idem, not by the config")
        return value


class PythonDelivery(ConfigModel):
    """A Python function an effect calls: ``function(payload, key)``, its JSON-able result recorded.

    The function is ``module:attribute`` (the module one of ``effect_modules:`` or below one);
    the payload is the JSON object ``body`` builds from the row, ``key`` the minted key.
    """

    function: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$", description="module:function"
    )
    body: dict[str, str] = Field(min_length=1, description="JSON field -> the row's column (or a system part).")

    @property
    def module(self) -> str:
        return self.function.split(":", 1)[0]

    def resolve(self) -> Callable[..., Any]:
        """The function itself (its module imported, from the config file's directory too).

        Raises:
            ValueError: the module cannot be imported, or has no such callable.
        """
        module_name, attribute = self.function.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any failure of a user's module is a config error
            raise ValueError(f"python.function: module {module_name!r} cannot be imported ({type(exc).__name__}: {exc})") from None
        found = getattr(module, attribute, None)
        if not callable(found):
            raise ValueError(f"python.function: {module_name!r} has no function {attribute!r}")
        return found


class EffectConfig(ConfigModel):
    """One outbound effect: on which rows (``record_type``, ``when``), what to do (``http``: a
    request, or ``python``: a function), under which key (``key``), and how hard to try
    (``max_attempts``, backoff)."""

    name: str = Field(pattern=f"^{NAME}$", description="[a-z0-9_-]{1,64}")
    record_type: str
    when: list[Condition] = Field(default_factory=list, description="All must hold; none: every written row.")
    key: tuple[str, ...] | None = Field(
        None, min_length=1, description="The minted key's parts; default DEFAULT_KEY (upsert: DEFAULT_UPSERT_KEY)."
    )
    on_change: tuple[Literal["inserted", "updated", "deleted"], ...] | None = Field(
        None, min_length=1, description="An upsert table's effect: the changes of its current state that fire it."
    )
    http: HttpDelivery | None = None
    python: PythonDelivery | None = Field(None, description="A function of an effect_modules: module, instead of http.")
    max_attempts: int = Field(5, ge=1, le=100, description="Tries in all, the first included.")
    backoff_seconds: float = Field(1.0, gt=0, description="Wait before the second try; doubles after each.")
    max_backoff_seconds: float = Field(300.0, gt=0)
    lease_seconds: float = Field(60.0, gt=0, description="How long a dispatcher's claim on a row holds.")
    warn_pending_after_seconds: float = Field(
        3600.0, gt=0, description="The effects_owed check warns when the oldest pending row is older."
    )
    results_table: str | None = Field(
        None, pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Keep each delivered answer as a row of idem.<results_table> (one per minted key).",
    )

    @field_validator("when", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _key_and_lease(self) -> EffectConfig:
        if (self.http is None) == (self.python is None):
            raise ValueError("an effect has exactly one of http: (a request) and python: (a function)")
        if self.key is not None and "effect" not in self.key:
            raise ValueError("key must include 'effect' (two effects on one row never share a key)")
        if self.http is not None and self.lease_seconds <= self.http.timeout_seconds:
            raise ValueError(
                f"lease_seconds ({self.lease_seconds:g}) must be longer than http.timeout_seconds "
                f"({self.http.timeout_seconds:g}): a claim must outlive the request it covers"
            )
        return self

    @property
    def body(self) -> dict[str, str]:
        """The JSON body (a request's, or a function's payload): field -> column or system part."""
        if self.http is not None:
            return self.http.body
        assert self.python is not None  # one of the two, checked at load
        return self.python.body

    def check_against(self, tables: dict[str, TableConfig]) -> None:
        """Check the record type, columns and constants against ``tables:``.

        Raises:
            ValueError: naming the key at fault.
        """
        table = tables.get(self.record_type)
        if table is None:
            raise ValueError(f"record_type {self.record_type!r} is not in tables ({', '.join(sorted(tables)) or 'none'})")
        upsert = _is_upsert(table)
        if not upsert and self.on_change is not None:
            raise ValueError(f"on_change: {self.record_type} is not an upsert table (mode: upsert); its effects fire on written rows")
        kinds = {name: ColumnType.parse(column.type).kind for name, column in table.columns.items()}
        for condition in self.when:
            _check_condition(condition, kinds)
        where = "http" if self.http is not None else "python"
        parts = SYSTEM_PARTS if upsert else {k: v for k, v in SYSTEM_PARTS.items() if k != "change"}
        for field, column in self.body.items():
            if column not in kinds and column not in parts or column == "effect":
                raise ValueError(f"{where}.body.{field}: {column!r} is neither a column of {self.record_type} nor one of "
                                 f"{', '.join(sorted(set(parts) - {'effect'}))}")
        for part in self.key_parts(upsert):
            if part not in kinds and part not in parts:
                raise ValueError(f"key part {part!r} is neither a column of {self.record_type} nor one of "
                                 f"{', '.join(sorted(parts))}")

    def key_parts(self, upsert: bool) -> tuple[str, ...]:
        """``key``, or the default of an effect on an append (``upsert`` false) or upsert table."""
        if self.key is not None:
            return self.key
        return DEFAULT_UPSERT_KEY if upsert else DEFAULT_KEY

    def rule(self, upsert: bool = False) -> OutboxRule:
        """What the commit needs of this effect (no URL, no headers: no secret travels with a plan).

        ``upsert``: the effect's table is an upsert table, so it fires on ``on_change``."""
        return OutboxRule(
            name=self.name,
            record_type=self.record_type,
            when=tuple((c.field, c.operator, _frozen(c.value)) for c in self.when),
            body=tuple(self.body.items()),
            key=self.key_parts(upsert),
            warn_pending_after_seconds=self.warn_pending_after_seconds,
            on_change=(self.on_change or DEFAULT_CHANGES) if upsert else (),
        )


def _is_upsert(table: TableConfig | None) -> bool:
    return getattr(table, "mode", None) == "upsert"


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


def check_effects(effects: list[EffectConfig], tables: dict[str, TableConfig], modules: list[str] | None = None) -> None:
    """Names are unique, every effect fits its table, and a function's module is listed and importable.

    ``modules``: ``effect_modules:`` (a function's module must be one of them or below one:
    a config names the code it runs, as ``assets:`` and ``migrations:`` do).

    Raises:
        ValueError: ``effects[i]: ...``.
    """
    seen: set[str] = set()
    taken = _table_names(tables)
    for index, effect in enumerate(effects):
        if effect.name in seen:
            raise ValueError(f"effects[{index}]: effect name {effect.name!r} is used twice")
        seen.add(effect.name)
        try:
            effect.check_against(tables)
            if effect.results_table is not None:
                _claim_results_table(effect.results_table, taken, effect.name)
            if effect.python is not None:
                _check_function(effect.python, modules or [])
        except ValueError as exc:
            raise ValueError(f"effects[{index}] ({effect.name}): {exc}") from None


def _table_names(tables: dict[str, TableConfig]) -> dict[str, str]:
    """Every table name in schema idem the config or idem itself uses -> what uses it."""
    taken = {name: "one of idem's own tables" for name in RESERVED_TABLE_NAMES}
    for record_type, table in tables.items():
        taken[table_name(record_type)] = f"the table of record type {record_type!r}"
        if getattr(table, "mode", None) == "upsert":
            for derived in upsert_relations(record_type):
                taken[derived] = f"a relation of the upsert table {record_type!r}"
    return taken


def _claim_results_table(name: str, taken: dict[str, str], effect: str) -> None:
    """``name`` is free (no table of the config, of idem, of another effect's results): take it."""
    if name in taken:
        raise ValueError(f"results_table {name!r} is {taken[name]} (schema idem): pick another name")
    taken[name] = f"the results table of effect {effect!r}"


def _check_function(python: PythonDelivery, modules: list[str]) -> None:
    """The function's module is listed in ``effect_modules:`` (or below one) and the function is there."""
    name = python.module
    if not any(name == listed or name.startswith(listed + ".") for listed in modules):
        raise ValueError(
            f"python.function: module {name!r} is not listed in effect_modules ({', '.join(modules) or 'none'})"
        )
    python.resolve()
