"""Runs: the run directory, the registry of runs, the per-node agent that owns a run."""
