"""The Dagster layer: resources, IO managers, the per-connector asset factory, sensors, schedules, checks.

Nothing here holds logic the core lacks: each piece adapts a core function to
Dagster's surface (context, config, metadata, cursors, run keys).
"""
