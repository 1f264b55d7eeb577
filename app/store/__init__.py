"""Persistence: decisions and their acknowledgements, tick diagnostics, overrides, audit log."""
