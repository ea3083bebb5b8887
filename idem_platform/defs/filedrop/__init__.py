"""The file-drop domain: per-connector assets, partitions, sensor and checks."""
