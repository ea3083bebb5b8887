"""HTTP push: `idem serve` lands NDJSON bodies and OTLP log exports as files in a connector's drop directory."""
