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
    """Definitions generated from ``idem.yaml`` (asset factory per connector).

    This location is idem's own, so its implicit asset job (the UI's "Materialize",
    backfills) runs in process too, like idem's jobs: the steps share one Spark session
    instead of starting one per step. A ``dg`` project's :class:`IdemComponent` leaves
    the project's executor alone.
    """
    return dg.Definitions.merge(build_definitions(load_config()), dg.Definitions(executor=dg.in_process_executor))
