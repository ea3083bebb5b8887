"""idem_platform: exactly-once JSON ingestion into PostgreSQL, on Dagster and Spark.

The package has two layers. Everything outside ``idem_platform.defs`` is the core:
keys, coercion, catalog, ledger, commit, file-drop reading and the Spark data
sources. It never imports Dagster, so the CLI and the HTTP server can use it alone.
``idem_platform.defs`` wires the core into Dagster (resources, IO managers, assets,
sensors, schedules, checks) and ``idem_platform.definitions`` is the one root.
"""

__version__ = "0.1.0"
