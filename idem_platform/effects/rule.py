"""An effect as a commit applies it: a plain value, free of config imports (connectors carry it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutboxRule:
    """An effect as the commit applies it: which written rows qualify, their body and key parts.

    Attributes:
        when: ``(column, operator, constant)`` triples, all of which must hold.
        body: ``(JSON field, column or system part)`` pairs.
        key: the minted key's parts, in order (see :data:`SYSTEM_PARTS`; else a column's text).
    """

    name: str
    record_type: str
    when: tuple[tuple[str, str, Any], ...]
    body: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    # The effects_owed check's bound on the oldest pending row (evaluated after each commit).
    warn_pending_after_seconds: float = 3600.0
    # An upsert table's effect: the changes of the current state that fire it (inserted,
    # updated, deleted); empty for an append table's (every written row).
    on_change: tuple[str, ...] = ()
