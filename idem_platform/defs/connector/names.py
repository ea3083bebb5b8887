"""How a connector's name appears in Dagster: its asset keys, job and asset group."""

import dagster as dg

from idem_platform.config import ConnectorConfig


def asset_keys(connector: ConnectorConfig) -> tuple[dg.AssetKey, dg.AssetKey, dg.AssetKey]:
    """``<connector>/ingest``, ``<connector>/coerced``, ``<connector>/committed``."""
    return (
        dg.AssetKey([connector.name, "ingest"]),
        dg.AssetKey([connector.name, "coerced"]),
        dg.AssetKey([connector.name, "committed"]),
    )


def job_name(connector: ConnectorConfig) -> str:
    """The connector's job: ``<connector>_ingest`` (what its sensor launches and ``idem ingest`` runs)."""
    return f"{connector.name.replace('-', '_')}_ingest"


def group_of(connector: ConnectorConfig) -> str:
    """The connector's asset group (Dagster group names take no ``-``)."""
    return connector.name.replace("-", "_")
