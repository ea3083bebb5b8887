"""The design's record rules, written once: the canonical form, the four keys and the catalog.

Nothing here knows Spark, PostgreSQL or Dagster; every layer above takes its rules from here.
"""
