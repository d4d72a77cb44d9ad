"""A DataLoader worker killed while a batch it made waits in the queue (for tests).

The batch's tensor travels as a file descriptor that the worker itself hands over (torch's
file_descriptor sharing), so taking it after the worker died fails with a connection error
inside multiprocessing's resource sharer, not torch's "DataLoader worker ... is killed".
torch's SIGCHLD handler is taken away so it does not report the death first: the same order of
events as when the kill lands while the rank is already receiving that batch (seen in a real
run, bench/gpu_faults.sh on CPU).
"""

import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.full((256,), float(i))


def main() -> None:
    it = iter(DataLoader(Rows(), batch_size=4, num_workers=1, prefetch_factor=2))
    next(it)  # the worker runs and has queued the next batches
    time.sleep(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.kill(it._workers[0].pid, signal.SIGKILL)
    time.sleep(0.5)
    next(it)  # a queued batch from the dead worker


if __name__ == "__main__":
    main()
