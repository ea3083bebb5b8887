"""Spark: the session builder, the file-drop lines source, the coercion step and the staging sink.

No Dagster here: the CLI, the HTTP server and the Dagster layer all build the
same frames through these functions.
"""
