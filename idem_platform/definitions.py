"""The code location's one root: ``idem_platform.definitions:defs``.

The environment is read here, when Dagster loads the location, and nowhere at
import time: ``IDEM_CONFIG`` (or ``./idem.yaml``) names the config, and
``IDEM_POSTGRES_URL`` / ``IDEM_SPARK_MASTER`` reach the resources.
"""

from __future__ import annotations

import dagster as dg

from idem_platform.config import load_config
from idem_platform.defs.definitions import build_definitions


@dg.definitions
def defs() -> dg.Definitions:
    """Definitions generated from ``idem.yaml`` (asset factory per connector)."""
    return build_definitions(load_config())
