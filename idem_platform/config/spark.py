"""``spark:``: how to reach Spark."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from idem_platform.config.common import ConfigModel


class SparkConfig(ConfigModel):
    """How to reach Spark; ``IDEM_SPARK_MASTER`` overrides ``master``."""

    master: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)
    server: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "`idem ingest` (and `idem demo`): `auto` runs on the long-lived Spark Connect server under "
            "<idem home>/spark when one is up for this master, settings and code (`idem spark start` "
            "starts it, `idem spark stop` stops it; `idem dev` runs one while it runs), so runs skip the "
            "JVM start; no run starts one itself. `off` always starts Spark in each run's own process. "
            "IDEM_SPARK_SERVER overrides; a named server (spark.conf's spark.remote, IDEM_SPARK_REMOTE) "
            "is always used."
        ),
    )

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value
