"""``tables:``: each record type's columns, schema version and schema contract."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from idem_platform.config.common import CONTRACT_HELP, ConfigModel, SchemaContract
from idem_platform.contract.catalog import POSTGRES_SYSTEM_COLUMNS, ColumnType, is_safe_column_name


class ColumnConfig(ConfigModel):
    """A column: ``confidence: int`` or ``name: {type: string, required: true}``."""

    type: str
    required: bool = False

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        ColumnType.parse(value)
        return value


class TableConfig(ConfigModel):
    """A record type's table (``idem.<record_type>``)."""

    schema_version: int = Field(1, ge=1, description="Bumped only on breaking changes.")
    columns: dict[str, ColumnConfig] = Field(default_factory=dict)
    schema_contract: SchemaContract | None = Field(
        None, description=f"{CONTRACT_HELP} Wins over the connector's; default: the connector's."
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
