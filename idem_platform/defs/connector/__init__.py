"""What every connector's assets share, whatever its source: ``coerced``, ``committed`` and their checks."""
