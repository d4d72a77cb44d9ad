"""The read side: the registry of runs, what the monitor watches, NCCL, doctor, metrics and
the maintenance a user asks of a finished run (delete, clone, resume)."""
