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

A config can also be built in Python (``IdemConfig.model_validate`` or its models): the
models of ``effects:`` are here too (``Effect``, ``Condition``, ``HttpDelivery``,
``PythonDelivery``), with ``IdemConfig``, ``load_config`` and ``remember_secrets`` (mask a
header value read in Python, as a ``${VAR}`` header of ``idem.yaml`` is masked). They are
imported on first use as well.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
# The lazily imported names: name -> (module, attribute).
_LAZY = {
    "IdemComponent": ("idem_platform.defs.component", "IdemComponent"),
    "IdemConfig": ("idem_platform.config.model", "IdemConfig"),
    "load_config": ("idem_platform.config.loader", "load_config"),
    "Effect": ("idem_platform.config.effects", "EffectConfig"),
    "EffectConfig": ("idem_platform.config.effects", "EffectConfig"),
    "Condition": ("idem_platform.config.effects", "Condition"),
    "HttpDelivery": ("idem_platform.config.effects", "HttpDelivery"),
    "PythonDelivery": ("idem_platform.config.effects", "PythonDelivery"),
    "remember_secrets": ("idem_platform.redact", "remember_secrets"),
}
__all__ = [
    "Condition",
    "Effect",
    "EffectConfig",
    "HttpDelivery",
    "IdemComponent",
    "IdemConfig",
    "PythonDelivery",
    "__version__",
    "load_config",
    "remember_secrets",
]

if TYPE_CHECKING:
    from idem_platform.config.effects import Condition, EffectConfig, HttpDelivery, PythonDelivery
    from idem_platform.config.effects import EffectConfig as Effect
    from idem_platform.config.loader import load_config
    from idem_platform.config.model import IdemConfig
    from idem_platform.defs.component import IdemComponent
    from idem_platform.redact import remember_secrets


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'idem_platform' has no attribute {name!r}")


def __dir__() -> list[str]:
    # dg lists a registry module's components by dir(): name the lazy ones too.
    return sorted({*globals(), *_LAZY})
