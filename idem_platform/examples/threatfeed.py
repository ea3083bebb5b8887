"""The threat-feed example's own asset: ``indicator_daily_confidence``, reading ``idem/indicator``.

``indicator_daily_confidence`` depends on the ``idem/indicator`` table asset. The
table's IO manager hands it the table as a lazy Spark DataFrame in the current schema
version, so the asset sees the read path (DESIGN §6) at work in ``dagster dev``.

User code joins the generated definitions through ``idem.yaml``: the example's config
lists this module under ``assets:``, and ``build_definitions`` adds its assets to the
one code location (``make dev``, ``workspace.yaml``). Python users may instead merge
``build_definitions(load_config())`` with their assets themselves
(:func:`example_definitions`).
"""

# No ``from __future__ import annotations``: Dagster reads the asset's annotations (the
# context's type, the input's DataFrame type) as objects.
from collections.abc import Sequence
from typing import Any

import dagster as dg
from pyspark.sql import DataFrame  # at run time: Dagster checks the input's type against it
from pyspark.sql import functions as F

from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.tables import table_key
from idem_platform.errors import ConfigError

# A confidence below 34 is low, below 67 medium, else high; no confidence is "unknown".
BANDS: tuple[tuple[int, str], ...] = ((34, "low"), (67, "medium"))
BAND_NAMES = ("low", "medium", "high", "unknown")
SHOWN_DAYS = 60  # the markdown table's most recent days (the counts cover every day)
EXAMPLE_GROUP = "threatfeed_reports"


def daily_confidence(indicators: DataFrame) -> DataFrame:
    """Indicators per day and confidence band: one row per day, a column per band.

    The day is the indicator's ``created`` date, or, when it has none, the day it was
    ingested; days are UTC days (idem's Spark sessions run with
    ``spark.sql.session.timeZone=UTC``). Pure DataFrame operations: the work runs on the
    executors, and the result has one row per day.
    """

    confidence = F.col("confidence")
    band = F.when(confidence.isNull(), F.lit("unknown"))
    for upper, name in BANDS:
        band = band.when(confidence < upper, F.lit(name))
    band = band.otherwise(F.lit("high"))
    day = F.to_date(F.coalesce(F.col("created"), F.col("_ingested_at")))
    counts = (
        indicators.select(day.alias("day"), band.alias("band"))
        .groupBy("day")
        .pivot("band", list(BAND_NAMES))  # the values given: no extra job to find them
        .count()
        .na.fill(0, list(BAND_NAMES))
    )
    total = sum((F.col(name) for name in BAND_NAMES[1:]), F.col(BAND_NAMES[0]))
    return counts.withColumn("total", total).orderBy(F.col("day").desc())


def markdown(rows: Sequence[dict[str, Any]], *, shown: int = SHOWN_DAYS) -> str:
    """The most recent ``shown`` days as a markdown table (newest first)."""
    lines = ["| day | " + " | ".join(BAND_NAMES) + " | total |", "|---|" + "---:|" * (len(BAND_NAMES) + 1)]
    for row in rows[:shown]:
        cells = " | ".join(f"{int(row[name]):,}" for name in (*BAND_NAMES, "total"))
        lines.append(f"| {row['day'] or '(no date)'} | {cells} |")
    if len(rows) > shown:
        lines.append(f"| … {len(rows) - shown:,} earlier days | " + " | ".join("" for _ in range(len(BAND_NAMES) + 1)) + " |")
    return "\n".join(lines)


@dg.asset(
    key="indicator_daily_confidence",
    ins={"indicator": dg.AssetIn(table_key("indicator"))},
    group_name=EXAMPLE_GROUP,
    kinds={"spark"},
    description=(
        "Indicators per day and confidence band (low < 34, medium < 67, high; unknown when absent), "
        "computed in Spark from the idem/indicator table asset, which the table IO manager loads as a "
        "DataFrame in the current schema version. Only the small per-day aggregate reaches the driver; "
        "the result is this materialization's metadata."
    ),
)
def indicator_daily_confidence(context: dg.AssetExecutionContext, indicator: DataFrame) -> dg.MaterializeResult:
    rows = [row.asDict() for row in daily_confidence(indicator).collect()]  # one row per day
    totals = {name: sum(int(row[name]) for row in rows) for name in BAND_NAMES}
    context.log.info("indicators by confidence band: %s over %d days", totals, len(rows))
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(len(rows)),
            "indicators": dg.MetadataValue.int(sum(totals.values())),
            "bands": dg.MetadataValue.json(totals),
            "days": dg.MetadataValue.int(len(rows)),
            "by_day": dg.MetadataValue.md(markdown(rows)),
        }
    )


def example_definitions(config: IdemConfig, *, postgres_url: str | None = None) -> dg.Definitions:
    """idem's definitions for ``config`` merged with the example's assets.

    Raises:
        ConfigError: ``config`` has no ``indicator`` record type for the example to read.
    """
    if "indicator" not in config.tables:
        raise ConfigError(
            "the threat-feed example reads the indicator table; this config declares "
            f"{', '.join(sorted(config.tables)) or 'no tables'}",
            path=str(config.source) if config.source else None,
            key="tables",
        )
    generated = build_definitions(config, postgres_url=postgres_url)
    if __name__ in config.assets:  # listed under `assets:`: already part of the generated definitions
        return generated
    return dg.Definitions.merge(generated, dg.Definitions(assets=[indicator_daily_confidence]))
