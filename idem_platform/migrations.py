"""Schema migrations: the registry of ``dict -> dict`` upcasters, and the chains they form.

A record type's ``schema_version`` (``tables.<type>.schema_version`` in
``idem.yaml``, starting at 1) is bumped only on a breaking change: a field
removed, renamed, retyped or given another meaning. Additive changes (a new
optional column, a widened type) never bump it. Each bump comes with one
migration, a plain function registered here::

    from idem_platform.migrations import schema_migration

    @schema_migration("indicator", from_version=1, to_version=2)
    def rename_score(record: dict) -> dict:
        record["risk"] = record.pop("score", None)
        return record

``idem.yaml`` lists the modules that hold them (``migrations: [my_pkg.migrations]``,
importable from the config file's directory too). Rows keep the version they
were written with; reading (the IO manager, ``idem read``) and ``idem migrate``
run the chain ``v -> v+1 -> ... -> current`` on ``_payload``.

Chains are checked when the definitions load (:func:`check_chains`): one step per
version, no gaps, no duplicates, ending at the table's current version, so a
broken chain fails the code location's load naming the type and the missing step
instead of failing a read months later.

Only the migrations of the modules a config lists are part of its chains (a
process may import other configs' modules: tests do, and a code server may host
several locations).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idem_platform.errors import ConfigError, TerminalError

MigrationFunction = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Migration:
    """One registered step of a record type's chain."""

    record_type: str
    from_version: int
    to_version: int
    function: MigrationFunction

    @property
    def module(self) -> str:
        return str(getattr(self.function, "__module__", "") or "")

    @property
    def name(self) -> str:
        """``module.function`` (how errors and reports name the step)."""
        return f"{self.module}.{getattr(self.function, '__qualname__', repr(self.function))}"

    @property
    def step(self) -> str:
        """``indicator v1->v2``."""
        return f"{self.record_type} v{self.from_version}->v{self.to_version}"


class MigrationChainError(ConfigError):
    """A record type's chain of migrations is broken (gap, duplicate, past the current version)."""


class MigrationFailed(TerminalError):
    """A migration raised or returned something that is not a dict, on one record.

    Attributes:
        step: the failing step (``indicator v1->v2``).
        function: the migration's ``module.function``.
        key: the row's ``_idempotency_key`` when known.
    """

    def __init__(self, message: str, *, step: str = "", function: str = "", key: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.function = function
        self.key = key


# Every migration ever registered in this process, in registration order.
_REGISTERED: list[Migration] = []


def schema_migration(record_type: str, *, from_version: int, to_version: int) -> Callable[[MigrationFunction], MigrationFunction]:
    """Register ``function(record) -> record`` as the step ``from_version -> to_version`` of ``record_type``.

    The function receives a dict (the record as the previous version shaped it,
    without the version field) and returns the dict of the next version; it may
    change the dict it was given. It runs inside Spark's Python workers, so it
    must be importable there (the module is imported by name).

    Raises:
        MigrationChainError: the versions are not ints with ``to_version == from_version + 1 >= 2``.
    """
    if not isinstance(record_type, str) or not record_type:
        raise MigrationChainError(f"@schema_migration needs a record type name, got {record_type!r}")
    for label, value in (("from_version", from_version), ("to_version", to_version)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MigrationChainError(f"@schema_migration({record_type!r}): {label} must be an int >= 1, got {value!r}")
    if to_version != from_version + 1:
        raise MigrationChainError(
            f"@schema_migration({record_type!r}, from_version={from_version}, to_version={to_version}): "
            "a migration moves one version (to_version = from_version + 1); chain several for a longer jump"
        )

    def register(function: MigrationFunction) -> MigrationFunction:
        if not callable(function):
            raise MigrationChainError(f"@schema_migration({record_type!r}) decorates {function!r}, which is not callable")
        migration = Migration(record_type, from_version, to_version, function)
        # A module imported again (importlib.reload, a test re-importing) replaces its own entries.
        _REGISTERED[:] = [
            m for m in _REGISTERED
            if not (m.name == migration.name and m.record_type == record_type and m.from_version == from_version)
        ]
        _REGISTERED.append(migration)
        return function

    return register


def load_modules(modules: Sequence[str], base_dir: str | Path | None = None, *, what: str = "migrations") -> None:
    """Import the modules a config lists (``base_dir``, the config file's directory, goes on ``sys.path``).

    Raises:
        ConfigError: a module cannot be imported (naming it and why).
    """
    if base_dir is not None:
        directory = str(Path(base_dir).resolve())
        if directory not in sys.path:
            sys.path.append(directory)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure of a user's module is a config error
            raise ConfigError(
                f"{what}: module {name!r} cannot be imported ({type(exc).__name__}: {exc}); it must be "
                f"importable from the environment or from the config file's directory ({base_dir})"
            ) from exc


def _in_modules(migration: Migration, modules: Iterable[str]) -> bool:
    module = migration.module
    return any(module == name or module.startswith(name + ".") for name in modules)


def registered(modules: Iterable[str]) -> list[Migration]:
    """The migrations the given modules (and their submodules) registered."""
    names = list(modules)
    return [m for m in _REGISTERED if _in_modules(m, names)]


@dataclass(frozen=True)
class Chains:
    """The validated chains of one config: record type -> {from_version: step}."""

    current: Mapping[str, int]
    steps: Mapping[str, Mapping[int, Migration]]
    # (record type, version) -> its path: upgrades run per record, in the executors' hot loop.
    _paths: dict[tuple[str, int], tuple[Migration, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def path(self, record_type: str, version: int) -> list[Migration]:
        """The steps that take ``record_type`` from ``version`` to its current version (empty if current).

        Raises:
            MigrationFailed: ``version`` is newer than the current one, or below 1.
        """
        return list(self._path(record_type, version))

    def _path(self, record_type: str, version: int) -> tuple[Migration, ...]:
        found = self._paths.get((record_type, version))
        if found is not None:
            return found
        current = self.current.get(record_type)
        if current is None:
            raise MigrationFailed(
                f"{record_type}: these migrations know no table {record_type!r} (its config's tables were not "
                "handed over)",
                step=f"{record_type} v{version}",
            )
        if version > current or version < 1:
            raise MigrationFailed(
                f"{record_type}: schema_version {version} is not between 1 and the current version {current}",
                step=f"{record_type} v{version}",
            )
        chain = self.steps.get(record_type, {})
        found = self._paths[(record_type, version)] = tuple(chain[v] for v in range(version, current))
        return found

    def upgrade(self, record_type: str, record: dict[str, Any], version: int, *, key: str | None = None) -> dict[str, Any]:
        """``record`` (at ``version``) run through the chain to the current version.

        Raises:
            MigrationFailed: a step raised or returned a non-dict; names the step, the
                function and ``key``.
        """
        for migration in self._path(record_type, version):
            try:
                result = migration.function(record)
            except Exception as exc:  # noqa: BLE001 - the user's function: report which and where
                raise _raised(migration, key, exc) from exc
            if not isinstance(result, dict):
                raise _not_a_dict(migration, key, result)
            record = result
        return record

    def upgrade_many(
        self,
        record_type: str,
        records: list[dict[str, Any] | None],
        version: int,
        key: Callable[[int], str],
        failed: Callable[[int, MigrationFailed], None],
    ) -> None:
        """``records`` (all at ``version``) run through the chain in place, step by step.

        The executors' hot loop: one pass over the rows per step, no call per row
        besides the user's function. A row whose step raises or returns a non-dict
        is handed to ``failed`` (with its position; ``key`` names it) and becomes
        ``None``; ``failed`` may raise to stop the batch. ``None`` rows are skipped.
        """
        for migration in self._path(record_type, version):
            function = migration.function
            for position, record in enumerate(records):
                if record is None:
                    continue
                try:
                    result = function(record)
                except Exception as exc:  # noqa: BLE001 - the user's function: report which and where
                    records[position] = None
                    failed(position, _raised(migration, key(position), exc))
                    continue
                if type(result) is not dict and not isinstance(result, dict):
                    records[position] = None
                    failed(position, _not_a_dict(migration, key(position), result))
                    continue
                records[position] = result


def _raised(migration: Migration, key: str | None, exc: BaseException) -> MigrationFailed:
    where = f" on row {key}" if key else ""
    return MigrationFailed(
        f"migration {migration.step} ({migration.name}) raised{where}: {type(exc).__name__}: {exc}",
        step=migration.step, function=migration.name, key=key,
    )


def _not_a_dict(migration: Migration, key: str | None, result: object) -> MigrationFailed:
    where = f" on row {key}" if key else ""
    return MigrationFailed(
        f"migration {migration.step} ({migration.name}) returned {type(result).__name__}, not a dict{where}",
        step=migration.step, function=migration.name, key=key,
    )


def check_chains(current: Mapping[str, int], modules: Sequence[str]) -> Chains:
    """Validate every chain the modules register against the tables' current versions.

    Each record type at version ``V`` needs exactly one step ``v -> v+1`` for every
    ``1 <= v < V``; a step for a type the config does not declare, or that goes
    past ``V``, is an error too (the config and the code disagree).

    Raises:
        MigrationChainError: naming the record type and the missing, duplicated or
            extra step (all problems, one per line).
    """
    by_type: dict[str, dict[int, list[Migration]]] = {}
    for migration in registered(modules):
        by_type.setdefault(migration.record_type, {}).setdefault(migration.from_version, []).append(migration)
    problems: list[str] = []
    for record_type in sorted(set(by_type) - set(current)):
        names = ", ".join(m.name for ms in by_type[record_type].values() for m in ms)
        problems.append(f"{record_type}: migrations registered ({names}) but no table {record_type!r} is declared")
    steps: dict[str, dict[int, Migration]] = {}
    for record_type, version in sorted(current.items()):
        chain = by_type.get(record_type, {})
        for start in range(1, version):
            found = chain.get(start, [])
            if not found:
                problems.append(
                    f"{record_type}: schema_version is {version} but no migration v{start}->v{start + 1} is "
                    f"registered (add @schema_migration({record_type!r}, from_version={start}, to_version={start + 1}) "
                    f"to one of the modules under `migrations:`{' (none listed)' if not modules else ''})"
                )
            elif len(found) > 1:
                problems.append(
                    f"{record_type}: {len(found)} migrations for v{start}->v{start + 1}: "
                    + ", ".join(m.name for m in found) + " (keep one)"
                )
        for start, found in sorted(chain.items()):
            if start >= version:
                problems.append(
                    f"{record_type}: migration v{start}->v{start + 1} ({found[0].name}) goes past the current "
                    f"schema_version {version} (bump tables.{record_type}.schema_version, or remove it)"
                )
        steps[record_type] = {start: found[0] for start, found in chain.items() if found and start < version}
    if problems:
        raise MigrationChainError("broken migration chain:\n  " + "\n  ".join(problems))
    return Chains(current=dict(current), steps=steps)


@dataclass(frozen=True)
class MigrationSource:
    """What a Spark worker needs to rebuild a config's chains (small, picklable).

    Executors are other processes (other machines on a cluster): they cannot use
    the driver's registry, so they import the same modules by name, with the
    config file's directory on ``sys.path``, and validate against the same
    current versions (every table of the config: a chain of a type this worker
    never sees is still part of the modules' registrations).

    Attributes:
        modules: the config's ``migrations:`` list.
        base_dir: the config file's directory, or ``None``.
        current: ``(record type, schema_version)`` of every declared table, sorted.
    """

    modules: tuple[str, ...] = ()
    base_dir: str | None = None
    current: tuple[tuple[str, int], ...] = ()

    def chains(self) -> Chains:
        """The validated chains, built once per process (modules imported on first use).

        Raises:
            ConfigError: a module cannot be imported.
            MigrationChainError: a chain is broken.
        """
        found = _CHAINS.get(self)
        if found is None:
            load_modules(self.modules, self.base_dir)
            found = _CHAINS[self] = check_chains(dict(self.current), self.modules)
        return found


# Per process: the chains of each MigrationSource already validated (workers are reused).
_CHAINS: dict[MigrationSource, Chains] = {}
