"""What every model of ``idem.yaml`` shares: strictness, and the schema-contract vocabulary."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from idem_platform.contract.keys import NAME_PATTERN

NAME = NAME_PATTERN.pattern
"""A connector's (or key namespace's) name: ``[a-z0-9_-]{1,64}``."""

# What a record's unknown top-level fields do (DESIGN §3): widen the table, reject the row,
# or stay in ``_payload`` only.
SchemaContract = Literal["evolve", "strict", "drop"]
CONTRACT_HELP = (
    "What unknown top-level fields do: evolve (new nullable text columns, unsafe names to props), "
    "strict (the row is a reject naming them) or drop (kept only in _payload)."
)


class ConfigModel(BaseModel):
    """Unknown keys are errors (a typo must not be ignored) and a parsed config never changes
    (it is shared by every asset, sensor and executor of a code location)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
