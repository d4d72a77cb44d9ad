"""`tunedeck tb RUN`: the command that serves a run's TensorBoard files (printed, not run: the
user picks the host, port and tunnel)."""

from __future__ import annotations

import shlex

from tunedeck.core.api import RunNotFound, clean, find_run, tensorboard_logdir
from tunedeck.core.spec import load_spec


def register(sub) -> None:
    s = sub.add_parser("tb", help="print the command that serves a run's TensorBoard files")
    s.add_argument("run", help="run id, unique prefix, or name")
    s.set_defaults(func=cmd_tb)


def cmd_tb(args) -> int:
    run = find_run(args.run)
    logdir = tensorboard_logdir(run.run_dir, load_spec(run.run.spec))
    if not logdir.is_dir():
        raise RunNotFound(
            f"run {run.run_id} has no TensorBoard files ({logdir}); tracking.tensorboard "
            "is off or the run has not started"
        )
    print(clean(f"tensorboard --logdir {shlex.quote(str(logdir))} --port 6006"))
    return 0
