"""Dynamic partitions: one per dropped file, keyed by its path relative to the drop directory."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from idem_platform.config import ConnectorConfig

# Dagster refuses these substrings in partition keys.
_FORBIDDEN = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")


def partitions_for(connector: ConnectorConfig) -> dg.DynamicPartitionsDefinition:
    """The connector's dynamic partitions definition (``<connector>_files``)."""
    return dg.DynamicPartitionsDefinition(name=f"{connector.name.replace('-', '_')}_files")


def partition_key_for(connector: ConnectorConfig, path: str | Path) -> str:
    """A file's partition key: its posix path relative to the drop directory.

    Files outside the drop directory (``idem ingest`` of any path) keep their
    absolute path. Substrings Dagster refuses are replaced; the run config
    always carries the real path, so the key is only a label.
    """
    resolved = Path(path).resolve()
    assert connector.path is not None
    try:
        key = resolved.relative_to(connector.path.resolve()).as_posix()
    except ValueError:
        key = resolved.as_posix()
    for bad in _FORBIDDEN:
        key = key.replace(bad, "_")
    return key


def path_for_partition(connector: ConnectorConfig, partition_key: str) -> Path:
    """The file a partition key names inside the drop directory (UI-launched runs)."""
    assert connector.path is not None
    candidate = Path(partition_key)
    return candidate if candidate.is_absolute() else connector.path / candidate
