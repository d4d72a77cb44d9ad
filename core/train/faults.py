"""Faults that tests and fault benchmarks inject into the built-in trainer.

Each is switched on by an environment variable; the trainer imports this module only when a
TUNEDECK_TEST_* variable is set, so a production run never loads it. `install` hooks the
faults into the trainer's seams (its batch iterator, its training forward, its per-step
hooks) instead of the training loop testing for them.

    TUNEDECK_TEST_CRASH_AT_STEP=STEP   the last rank raises after STEP (first attempt only)
    TUNEDECK_TEST_SLOW_RANK=RANK:S     that rank's forward takes S seconds more
    TUNEDECK_TEST_LOADER_DELAY=RANK:S  that rank waits S seconds more for every batch
    TUNEDECK_TEST_HANG_RANK=RANK:STEP  after STEP that rank stops making progress for good,
                                       ignoring a graceful stop (first attempt only)
    TUNEDECK_TEST_COMPILE_FAIL=1       compiling the layers and the loss's chunk math fails (a
                                       backend that raises), so both must fall back to eager

tests/test_restarts.py, test_train_resume.py, test_straggler_live.py, test_detect_live.py,
test_stacks.py, test_gpu_fixtures.py and bench/gpu_faults.sh rely on these names and formats.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterator

from tunedeck.core.train import ce_kernel
from tunedeck.core.train.trainer import attempt

if TYPE_CHECKING:
    import torch

    from tunedeck.core.train.trainer import Trainer

CRASH_ENV = "TUNEDECK_TEST_CRASH_AT_STEP"
SLOW_ENV = "TUNEDECK_TEST_SLOW_RANK"
LOADER_DELAY_ENV = "TUNEDECK_TEST_LOADER_DELAY"
COMPILE_FAIL_ENV = "TUNEDECK_TEST_COMPILE_FAIL"
HANG_ENV = "TUNEDECK_TEST_HANG_RANK"


def _test_hook(name: str, rank: int) -> float | None:
    """The number of a "RANK:VALUE" variable when it names this rank, else None."""
    spec = os.environ.get(name)
    if spec:
        r, _, value = spec.partition(":")
        if r.strip() == str(rank):
            return float(value or 0.1)
    return None


def install(trainer: Trainer) -> None:
    """Wrap the trainer's seams with the faults the environment asks of this rank."""
    rank, last = trainer.d.rank, trainer.d.world_size - 1
    if os.environ.get(COMPILE_FAIL_ENV):
        ce_kernel.use_backend(_failing_backend)  # asked for only where train.compile applies
        if trainer.compiler is not None:
            trainer.compiler.backend = _failing_backend
            trainer.compiler.setup()  # re-compiled with it; the first forward fails to compile
    delay_s = _test_hook(LOADER_DELAY_ENV, rank)
    if delay_s:
        trainer.train_batches = _delayed(trainer.train_batches, delay_s)
    slow_s = _test_hook(SLOW_ENV, rank)
    if slow_s:
        trainer.train_forward = _slowed(trainer.train_forward, slow_s)
    # The hang and the crash are for the first attempt only: the restart must get through.
    if attempt() > 0:
        return
    hang_after = _test_hook(HANG_ENV, rank)
    if hang_after is not None:

        def hang(done: int) -> None:
            if done >= hang_after:
                _test_hang(rank, done)

        trainer.before_step.append(hang)
    crash_at = int(os.environ.get(CRASH_ENV, "0") or 0)
    if crash_at and rank == last:

        def crash(done: int) -> None:
            if done == crash_at:
                raise RuntimeError(f"{CRASH_ENV}={crash_at}: injected failure after step {done}")

        trainer.after_step.append(crash)


def _failing_backend(gm, example_inputs):
    raise RuntimeError(f"{COMPILE_FAIL_ENV}: injected compiler failure")


def _delayed(batches: Iterator[dict], delay_s: float) -> Iterator[dict]:
    """A starved loader. The sleep follows the fetch, so the step counts it as data wait."""
    for b in batches:
        time.sleep(delay_s)
        yield b


def _slowed(
    forward: Callable[[dict], torch.Tensor], slow_s: float
) -> Callable[[dict], torch.Tensor]:
    """A slow rank. The step times the forward as compute_s, which straggler detection reads."""

    def slow_forward(b: dict) -> torch.Tensor:
        loss = forward(b)
        time.sleep(slow_s)
        return loss

    return slow_forward


def _test_hang(rank: int, step: int) -> None:
    """Never returns. `tunedeck stacks` and tests/test_stacks.py recognise the hung rank by
    this frame's name, and by it being outside any collective."""
    print(f"{HANG_ENV}: rank {rank} hangs after step {step}", file=sys.stderr, flush=True)
    while True:  # a real hang does not look at the stop flag either
        time.sleep(1)
