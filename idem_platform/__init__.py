"""idem_platform: exactly-once JSON ingestion into PostgreSQL, on Dagster and Spark.

The package has two layers. Everything outside ``idem_platform.defs`` is the core:
keys, coercion, catalog, ledger, commit, file-drop reading and the Spark data
sources. It never imports Dagster, so the CLI and the HTTP server can use it alone.
``idem_platform.defs`` wires the core into Dagster (resources, IO managers, assets,
sensors, schedules, checks) and ``idem_platform.definitions`` is the one root of the
standalone code location. ``idem_platform.IdemComponent`` is the same definitions as a
Dagster component, for a ``dg`` project of your own (``dg scaffold defs
idem_platform.IdemComponent feeds``); it is imported on first use, so the core and the
CLI still start without Dagster.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["IdemComponent", "__version__"]

if TYPE_CHECKING:
    from idem_platform.defs.component import IdemComponent


def __getattr__(name: str) -> Any:
    if name == "IdemComponent":
        from idem_platform.defs.component import IdemComponent

        return IdemComponent
    raise AttributeError(f"module 'idem_platform' has no attribute {name!r}")


def __dir__() -> list[str]:
    # dg lists a registry module's components by dir(): name the lazy one too.
    return sorted({*globals(), "IdemComponent"})
