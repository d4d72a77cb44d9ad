"""Rules that turn log evidence and telemetry into findings (cause and fix)."""
