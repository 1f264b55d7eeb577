"""Adapters in: traffic observations (Prometheus, direct frontend scrape), profiling data files,
request traces. Each translates its failures into domain errors with the reason."""
