"""Dynamic partitions: one per dropped file, keyed by its path relative to the drop directory."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from idem_platform.config import ConnectorConfig, FileConnector, FileConnectorBase
from idem_platform.errors import ConfigError

# Dagster refuses these substrings in partition keys.
_FORBIDDEN = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")


def partitions_for(connector: FileConnector) -> dg.DynamicPartitionsDefinition:
    """The connector's dynamic partitions definition (``<connector>_files``)."""
    return dg.DynamicPartitionsDefinition(name=f"{connector.identifier}_files")


def partition_key_for(connector: FileConnector, path: str | Path) -> str:
    """A file's partition key: its posix path relative to the drop directory.

    A file outside the drop directory (``idem ingest`` of any path) is
    ``external/<sha1 of its directory, 8 hex>/<name>``: a relative name that
    says where it came from without printing machine paths, and two files of one
    name in two directories stay apart. Substrings Dagster refuses are replaced;
    the run config always carries the real path, so the key is only a label.
    """
    resolved = Path(path).resolve()
    if connector.path is None:
        raise ValueError(f"connector {connector.name!r} has no drop directory")
    try:
        key = resolved.relative_to(connector.path.resolve()).as_posix()
    except ValueError:
        folder = hashlib.sha1(resolved.parent.as_posix().encode("utf-8", "surrogateescape")).hexdigest()[:8]
        key = f"external/{folder}/{resolved.name}"
    for bad in _FORBIDDEN:
        key = key.replace(bad, "_")
    return key


def path_for_partition(connector: FileConnector, partition_key: str) -> Path:
    """The file a partition key names inside the drop directory (UI-launched runs).

    Raises:
        ConfigError: the key is absolute, climbs out with ``..``, or names a file that
            was ingested from outside the drop directory (only ``idem ingest`` reads those).
    """
    if connector.path is None:
        raise ValueError(f"connector {connector.name!r} has no drop directory")
    candidate = Path(partition_key)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise ConfigError(f"partition {partition_key!r} is not a path inside the drop directory {connector.path}")
    if candidate.parts[:1] == ("external",):
        raise ConfigError(
            f"partition {partition_key!r} is a file ingested from outside the drop directory: "
            f"ingest it again with `idem ingest --connector {connector.name} <its path>` (the ingest "
            "asset's config reads only files inside the drop directory)"
        )
    return connector.path / candidate


def files_by_partition(
    connector: ConnectorConfig, files: list[dict[str, Any]], partitions: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """A batch commit's ``files`` entries grouped by the partition each file is (only
    ``partitions``, the run's; a connector without a drop directory has none)."""
    if not isinstance(connector, FileConnectorBase) or connector.path is None:
        return {}
    wanted = set(partitions)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in files:
        path = entry.get("file")
        if path is None:
            continue
        partition = partition_key_for(connector, path)
        if partition in wanted:
            grouped.setdefault(partition, []).append(entry)
    return grouped
