"""``IdemComponent``: idem in a project of your own, through ``dg`` and a ``defs.yaml``.

.. code-block:: yaml

    type: idem_platform.IdemComponent
    attributes:
      config_file: idem.yaml          # relative to this defs.yaml
      connectors: [orders]            # optional: only these connectors
      postgres_url_env: IDEM_POSTGRES_URL
    post_processing:
      assets:
        - target: "*"
          attributes: {owners: [team:data]}

The component builds what the standalone code location builds
(:func:`~idem_platform.defs.definitions.build_definitions`): assets, checks, jobs,
sensors and resources. Its resources and jobs carry idem's own names, so several
components and a project's own ``postgres``/``spark`` resources load side by side
(:mod:`idem_platform.defs.shared`). ``post_processing`` is Dagster's own: it reaches
every idem asset as it reaches any component's.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from pydantic import Field

from idem_platform.config import IdemConfig, load_config, parse_config
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.resources import ResourceKeys
from idem_platform.defs.shared import spark_settings
from idem_platform.errors import ConfigError
from idem_platform.settings import POSTGRES_URL_ENV
from idem_platform.spark.session import spark_config_for

STARTER_CONFIG = """\
# idem's config for this component: connectors (what to read) and tables (what to write).
# Paths are relative to this file. Reference: docs/config.md of idem_platform.
connectors:
  - name: {name}
    kind: filedrop
    path: drop              # drop NDJSON files here; the sensor commits each file once
    record_type: {name}_event
    id_field: id
tables:
  {name}_event:
    columns:
      id: {{type: string, required: true}}
      value: real
      at: timestamp
"""


class IdemScaffolder(dg.Scaffolder):
    """``dg scaffold defs idem_platform.IdemComponent <path>``: a ``defs.yaml``, a starter
    ``idem.yaml`` beside it and its drop directory, ready to load."""

    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        dg.scaffold_component(request, {"config_file": "idem.yaml"})
        name = re.sub(r"[^a-z0-9_]", "_", request.target_path.name.lower()).strip("_") or "feed"
        config = request.target_path / "idem.yaml"
        if not config.exists():
            config.write_text(STARTER_CONFIG.format(name=name), encoding="utf-8")
        (request.target_path / "drop").mkdir(parents=True, exist_ok=True)


@dg.scaffold_with(IdemScaffolder)
class IdemComponent(dg.Component, dg.Model, dg.Resolvable):
    """idem's connectors, tables, checks, jobs and sensors from an ``idem.yaml``.

    Give ``config_file`` (an ``idem.yaml`` relative to this ``defs.yaml``) or ``config``
    (the same ``connectors:``/``tables:``/... inline). Components on one database share
    its resources; a component naming another ``postgres_url_env`` gets resources of its
    own (``idem_postgres__<env var>``).
    """

    config_file: str | None = Field(
        default=None, description="Path of an idem.yaml, relative to this defs.yaml."
    )
    config: dict[str, Any] | None = Field(
        default=None, description="The idem.yaml's content inline (connectors:, tables:, ...), instead of config_file."
    )
    connectors: list[str] | None = Field(
        default=None, description="Only these connectors of the config (default: all)."
    )
    postgres_url_env: str = Field(
        default=POSTGRES_URL_ENV,
        description="The environment variable holding the PostgreSQL URL (read at launch, never stored). "
        "Unset IDEM_POSTGRES_URL means idem's embedded server.",
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        config = self.idem_config(context.path)
        where = _relative(context.path, context.defs_module_path)
        first = _claim(context.defs_module_path, where, config, self.postgres_url_env)
        return build_definitions(
            config,
            postgres_url_env=self.postgres_url_env,
            job_suffix="__" + re.sub(r"\W", "_", where),
            purge=first,
        )

    def idem_config(self, directory: Path) -> IdemConfig:
        """The parsed config, narrowed to ``connectors`` when given (validated by idem's loader).

        Raises:
            ConfigError: neither or both of config_file and config, an invalid config, or an
                unknown connector name.
        """
        if (self.config_file is None) == (self.config is None):
            raise ConfigError("give exactly one of config_file (a path to an idem.yaml) and config (inline)")
        if self.config_file is not None:
            config = load_config(directory / self.config_file)
        else:
            config = parse_config(yaml.safe_dump(self.config, sort_keys=False), directory / "defs.yaml")
        if self.connectors is None:
            return config
        chosen = [config.connector(name) for name in self.connectors]  # raises naming the known ones
        return config.model_copy(update={"connectors": chosen})


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


_claims: dict[tuple[Path, str], tuple[str, str]] = {}
_claims_lock = threading.Lock()


def _claim(root: Path, where: str, config: IdemConfig, env: str) -> bool:
    """Refuse, naming both components, what would make Dagster refuse two resource objects
    under one key: two components on one database with different Spark settings, or
    declaring one record type differently. True for the database's first component (it
    brings the database's purge job and schedule, which Dagster takes once).

    Claims are per project (``root``, its defs folder) and replaced by the same component
    loading again.
    """
    keys = ResourceKeys.for_env(env)
    wanted = {keys.spark: spark_settings(spark_config_for(config.spark_master(), dict(config.spark.conf)))}
    for name, spec in config.table_specs.items():
        wanted[f"{keys.table_io_manager}:{name}"] = repr(spec)
    with _claims_lock:
        for what, settings in wanted.items():
            other = _claims.get((root, what))
            if other is not None and other[1] != where and other[0] != settings:
                subject = "Spark settings" if what == keys.spark else f"record type {what.split(':', 1)[1]!r}"
                raise ConfigError(
                    f"components {other[1]} and {where} share the database of {env} but not their {subject}: "
                    "make them agree, or give one its own postgres_url_env"
                )
        for what, settings in wanted.items():
            _claims[(root, what)] = (settings, where)
        owner = _claims.setdefault((root, keys.named("ledger_purge_hourly")), ("", where))
        return owner[1] == where
