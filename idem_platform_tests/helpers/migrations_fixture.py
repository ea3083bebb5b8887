"""Test migrations: the ``reading`` record type's chain v1 -> v2 -> v3, with a fixture per version.

* v1 -> v2 renames fields: ``temp`` becomes ``temperature`` (still °F) and ``meta``
  becomes ``labels``. A reading of the sensor ``broken`` cannot be migrated (the
  step raises), which is how the tests get a failing row.
* v2 -> v3 changes a unit: ``temperature`` is in °C from v3 on (same name, another
  meaning: a breaking change, hence a version).

``test_migrations`` walks every migration this module registers against
:data:`FIXTURES`, and copies this file beside a config (under another module name)
to prove ``migrations:`` modules are importable from the config file's directory.
"""

from __future__ import annotations

from typing import Any

from idem_platform.migrations import schema_migration

BROKEN_SENSOR = "broken"


@schema_migration("reading", from_version=1, to_version=2)
def rename_temp_and_meta(record: dict[str, Any]) -> dict[str, Any]:
    """v2: ``temp`` -> ``temperature``, ``meta`` -> ``labels``."""
    if record.get("sensor") == BROKEN_SENSOR:
        raise ValueError(f"sensor {BROKEN_SENSOR!r} has no calibration")
    if "temp" in record:
        record["temperature"] = record.pop("temp")
    if "meta" in record:
        record["labels"] = record.pop("meta")
    return record


@schema_migration("reading", from_version=2, to_version=3)
def fahrenheit_to_celsius(record: dict[str, Any]) -> dict[str, Any]:
    """v3: ``temperature`` in °C."""
    fahrenheit = record.get("temperature")
    if fahrenheit is not None:
        record["temperature"] = round((fahrenheit - 32) * 5 / 9, 6)
    return record


# Per record type, records as each version shapes them: the walk checks step v -> v+1
# turns fixture[v] into fixture[v+1] for every registered step.
FIXTURES: dict[str, list[dict[int, dict[str, Any]]]] = {
    "reading": [
        {
            1: {"id": "r1", "sensor": "s1", "temp": 212, "meta": {"site": "a"}},
            2: {"id": "r1", "sensor": "s1", "temperature": 212, "labels": {"site": "a"}},
            3: {"id": "r1", "sensor": "s1", "temperature": 100.0, "labels": {"site": "a"}},
        },
        {
            1: {"id": "r2", "sensor": "s2", "temp": 98.6, "taken": "2026-01-01T00:00:00Z"},
            2: {"id": "r2", "sensor": "s2", "temperature": 98.6, "taken": "2026-01-01T00:00:00Z"},
            3: {"id": "r2", "sensor": "s2", "temperature": 37.0, "taken": "2026-01-01T00:00:00Z"},
        },
        {  # nothing to convert: the steps keep what they do not know
            1: {"id": "r3", "sensor": "s3", "note": "offline"},
            2: {"id": "r3", "sensor": "s3", "note": "offline"},
            3: {"id": "r3", "sensor": "s3", "note": "offline"},
        },
    ],
}


# The sensors feed's connector, as idem.yaml lists it.
SENSORS = """  - name: sensors
    kind: filedrop
    path: drop/sensors
    record_type: reading
    id_field: id
"""
REQUIRED_SENSOR = "{type: string, required: true}"


def reading_config(version: int, columns: dict[str, str], *, connectors: str = SENSORS, migrations: str = "") -> str:
    """idem.yaml of ``connectors`` writing the ``reading`` table at ``version`` with ``columns``
    (name: its YAML type), and the ``migrations:`` modules, if any."""
    lines = ["connectors:", connectors.rstrip("\n"), "tables:", "  reading:", f"    schema_version: {version}", "    columns:"]
    lines += [f"      {name}: {kind}" for name, kind in columns.items()]
    if migrations:
        lines.append(f"migrations: [{migrations}]")
    return "\n".join(lines) + "\n"


# The sensors feed at v1, before any bump: the config test_migrations and test_migrate start from.
V1_CONFIG = reading_config(1, {"sensor": REQUIRED_SENSOR, "temp": "real", "taken": "timestamp", "meta": "dynamic"})
