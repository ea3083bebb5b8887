"""``idem.yaml``: the one file that declares connectors, tables, migrations and Spark.

Parsed into typed pydantic models. Every error names the file, the dotted key
(``connectors[0].max_reject_ratio``), its line when known, and what is wrong, so
a user can fix the file without reading our code. ``${VAR}`` and
``${VAR:-default}`` in string values are resolved from the environment at load.
Relative paths are relative to the file itself, not to the working directory.

The models by concern: :mod:`.connectors` (one per ``kind``, :data:`ConnectorConfig` their
union), :mod:`.tables`, :mod:`.spark`, :mod:`.model` (:class:`IdemConfig`, the whole file);
:mod:`.loader` reads the file. idem's own environment variables (``IDEM_CONFIG``,
``IDEM_SPARK_*``) are read in :mod:`idem_platform.settings`.
"""

from idem_platform.config.common import SchemaContract
from idem_platform.config.connectors import (
    KINDS,
    MANAGED_KAFKA_SETTINGS,
    PUSH_SENSOR_INTERVAL_SECONDS,
    ConnectorBase,
    ConnectorConfig,
    FileConnector,
    FileConnectorBase,
    FileDropConnector,
    HttpConnector,
    KafkaConnector,
    OtlpConnector,
    PushConnector,
    PushConnectorBase,
)
from idem_platform.config.loader import load_config, parse_config
from idem_platform.config.model import IdemConfig
from idem_platform.config.spark import SparkConfig
from idem_platform.config.tables import ColumnConfig, TableConfig

# idem's own environment variables are named and read in idem_platform.settings; their names
# stay importable from here for code written before they moved.
from idem_platform.settings import CONFIG_ENV, SPARK_MASTER_ENV, SPARK_REMOTE_ENV, SPARK_SERVER_ENV

__all__ = [
    "CONFIG_ENV",
    "KINDS",
    "MANAGED_KAFKA_SETTINGS",
    "PUSH_SENSOR_INTERVAL_SECONDS",
    "SPARK_MASTER_ENV",
    "SPARK_REMOTE_ENV",
    "SPARK_SERVER_ENV",
    "ColumnConfig",
    "ConnectorBase",
    "ConnectorConfig",
    "FileConnector",
    "FileConnectorBase",
    "FileDropConnector",
    "HttpConnector",
    "IdemConfig",
    "KafkaConnector",
    "OtlpConnector",
    "PushConnector",
    "PushConnectorBase",
    "SchemaContract",
    "SparkConfig",
    "TableConfig",
    "load_config",
    "parse_config",
]
