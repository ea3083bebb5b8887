"""The ingest path end to end: plan a source's batch, read and coerce it in Spark, commit it
(and the quarantine loop that retries rejects through the same path)."""
