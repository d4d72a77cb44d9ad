"""Incremental readers for files that runs append to (events, logs)."""
