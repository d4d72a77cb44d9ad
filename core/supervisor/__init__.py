"""The supervisor: what starts, runs, adopts and stops a run (the per-node agent, its launch,
restarts, monitors and process identities). It writes the store; the views read it."""
