"""How a connector's name appears in Dagster: one spelling for all of it.

Dagster's group, job, op and sensor names take no ``-``; asset keys do. Every name here is
built from :attr:`~idem_platform.config.connectors.ConnectorBase.identifier` (``-`` as
``_``), so connector ``threatfeed-push`` is ``threatfeed_push/ingest``, group
``threatfeed_push``, job ``threatfeed_push_ingest``, op ``threatfeed_push__ingest`` and
sensor ``threatfeed_push_push_sensor``: one string to search the UI for.
"""

import dagster as dg

from idem_platform.config import ConnectorConfig

SENSOR_WATCHES = {"filedrop": "filedrop", "http": "push", "otlp": "otlp", "kafka": "kafka"}
"""What a connector's sensor watches, by ``kind``: its name's suffix (``<connector>_<watches>_sensor``)."""


def asset_keys(connector: ConnectorConfig) -> tuple[dg.AssetKey, dg.AssetKey, dg.AssetKey]:
    """``<connector>/ingest``, ``<connector>/coerced``, ``<connector>/committed``."""
    return (
        dg.AssetKey([connector.identifier, "ingest"]),
        dg.AssetKey([connector.identifier, "coerced"]),
        dg.AssetKey([connector.identifier, "committed"]),
    )


def job_name(connector: ConnectorConfig) -> str:
    """The connector's job: ``<connector>_ingest`` (what its sensor launches and ``idem ingest`` runs)."""
    return f"{connector.identifier}_ingest"


def group_of(connector: ConnectorConfig) -> str:
    """The connector's asset group: ``<connector>``."""
    return connector.identifier


def sensor_name(connector: ConnectorConfig) -> str:
    """The connector's sensor, named for what it watches: ``<connector>_filedrop_sensor`` (a
    drop directory), ``_push_sensor`` (``idem serve``'s HTTP bodies), ``_otlp_sensor``
    (OTLP log bodies), ``_kafka_sensor`` (topics)."""
    return f"{connector.identifier}_{SENSOR_WATCHES[connector.kind]}_sensor"
