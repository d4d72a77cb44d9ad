"""The GPU queue of one tunedeck home: runs launched with `run.queue` wait, each in its own
agent, until their GPUs are free. No daemon: the queue is the run directories' state.json
(`status = "queued"`, `queue`), read under a file lock beside the runs root, so it survives
any agent's death and a reboot (the next tunedeck command adopts a lost agent's run)."""
