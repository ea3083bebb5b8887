"""``tables:``: each record type's columns, schema version and schema contract."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from idem_platform.config.common import CONTRACT_HELP, ConfigModel, SchemaContract
from idem_platform.contract.catalog import (
    EXTERNAL_ID,
    IDENTITY_KINDS,
    POSTGRES_SYSTEM_COLUMNS,
    SOURCE_ORDER,
    SOURCE_POSITION,
    UPSERT_ORDER_KINDS,
    ColumnType,
    UpsertSpec,
    is_safe_column_name,
)


class ColumnConfig(ConfigModel):
    """A column: ``confidence: int`` or ``name: {type: string, required: true}``."""

    type: str
    required: bool = False

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        ColumnType.parse(value)
        return value


class DeleteWhen(ConfigModel):
    """``delete_when: {field: op, equals: d}``: a record whose top-level ``field`` equals
    ``equals`` (as JSON values: ``1`` equals ``1.0``, ``"1"`` does not) deletes its identity."""

    field: StrictStr = Field(min_length=1)
    equals: StrictBool | StrictInt | StrictFloat | StrictStr


class TableConfig(ConfigModel):
    """A record type's table (``idem.<record_type>``)."""

    schema_version: int = Field(1, ge=1, description="Bumped only on breaking changes.")
    columns: dict[str, ColumnConfig] = Field(default_factory=dict)
    schema_contract: SchemaContract | None = Field(
        None, description=f"{CONTRACT_HELP} Wins over the connector's; default: the connector's."
    )
    mode: Literal["append", "upsert"] = Field(
        "append",
        description="append: every version in idem.<type>; upsert: also the current row per identity "
        "(idem.<type>_current).",
    )
    identity: list[str] | None = Field(
        None, description="upsert: the columns naming an identity; default: the connector's id field."
    )
    order_by: str | None = Field(
        None,
        description="upsert: the column (int, long, real or timestamp) whose greatest value is current; "
        "none: the source's own order (commit order, then a file's lines or a partition's offsets); "
        "none on a table fed by a format: debezium connector (its order is the source position).",
    )
    delete_when: DeleteWhen | None = Field(None, description="upsert: the records that delete their identity.")

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

    @model_validator(mode="after")
    def _upsert_keys(self) -> TableConfig:
        """An upsert table's order is a number or timestamp column, or none (the source's own
        order); its identity declared scalar columns, or the id field; the upsert keys mean
        nothing in append mode."""
        if self.mode == "append":
            given = [k for k in ("identity", "order_by", "delete_when") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only for mode: upsert tables")
            return self
        if self.order_by is None:
            return self._identity_checked()  # the source's order, or a Debezium table's
        order = self.columns.get(self.order_by)
        if order is None or ColumnType.parse(order.type).kind not in UPSERT_ORDER_KINDS:
            raise ValueError(
                f"order_by {self.order_by!r} must be a declared column of type "
                f"{', '.join(UPSERT_ORDER_KINDS)} (versions are compared by its value)"
            )
        return self._identity_checked()

    def _identity_checked(self) -> TableConfig:
        """``identity`` names distinct declared scalar columns, none of them the ``order_by``."""
        if self.identity is not None:
            if not self.identity or len(set(self.identity)) != len(self.identity):
                raise ValueError("identity must list one or more distinct columns")
            for name in self.identity:
                column = self.columns.get(name)
                if column is None or ColumnType.parse(column.type).kind not in IDENTITY_KINDS:
                    raise ValueError(
                        f"identity column {name!r} must be a declared column of type {', '.join(IDENTITY_KINDS)} "
                        "(leave identity out to use the connector's id field)"
                    )
                if name == self.order_by:
                    raise ValueError(f"{name!r} cannot be both the identity and the order_by")
        return self

    def upsert_spec(self, *, debezium: bool = False) -> UpsertSpec | None:
        """The catalog's view of the upsert keys; ``None`` for an append table. ``debezium``:
        a ``format: debezium`` connector feeds it (its order is the source position)."""
        if self.mode != "upsert":
            return None
        if debezium and self.identity:
            return UpsertSpec(identity=tuple(self.identity), order_by=SOURCE_POSITION, debezium=True)
        delete = self.delete_when
        return UpsertSpec(
            identity=tuple(self.identity) if self.identity else (EXTERNAL_ID,),
            order_by=self.order_by if self.order_by is not None else SOURCE_ORDER,
            delete_field=delete.field if delete is not None else None,
            delete_equals=json.dumps(delete.equals) if delete is not None else None,
        )
