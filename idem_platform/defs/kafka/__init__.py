"""The Kafka domain: per-connector ``ingest`` asset, job and sensor."""
