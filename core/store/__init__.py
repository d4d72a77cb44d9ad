"""A run's records: run.db (events, telemetry, findings) and what state.json holds."""
