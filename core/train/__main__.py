"""Entry point for torchrun: python -m torch.distributed.run ... -m tunedeck.core.train --run-dir DIR."""

import argparse
import atexit
import os
import sys
import threading
from typing import NoReturn

from tunedeck.core.train.trainer import main


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tunedeck.core.train",
        description="tunedeck built-in trainer (one torchrun worker)",
    )
    ap.add_argument("--run-dir", required=True, help="run directory holding spec.toml")
    args = ap.parse_args(argv)
    return main(args.run_dir)


def leave(rc: int) -> NoReturn:
    """End the rank without the interpreter's teardown. With torch, transformers and peft
    loaded, collecting every module's objects takes ~1 s of CPU at each rank's exit (2-core
    machine), which a run's end, each restart and each stop wait on. What a normal exit does
    that matters still happens first: other threads are joined, atexit's handlers run
    (logging's flush, multiprocessing ending DataLoader workers, the compiler's worker pools)
    and the standard streams are flushed; the trainer has closed its own files by then."""
    try:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing left to save
                pass
        os._exit(rc)


if __name__ == "__main__":
    leave(cli())
