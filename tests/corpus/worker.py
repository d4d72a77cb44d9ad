"""A 2-rank gloo job that fails the way argv[1] names; tests/corpus/record.py runs it under
torchrun and keeps the console as a user would paste it.

Each mode is a real failure on CPU: an exception, a signal, a hang, a DataLoader worker's
death or error, host memory, file descriptors, DDP's unused parameters, a bad flag.
"""

import argparse
import os
import resource
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


class _Data(torch.utils.data.Dataset):
    def __init__(self, mode: str, rank: int) -> None:
        self.mode, self.rank = mode, rank

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.rank == 1 and i == 5:
            if self.mode == "loader_killed":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "loader_raise":
                raise KeyError(f"sample {i} has no 'messages' field")
        return torch.full((4,), float(i))


class _HalfUsed(torch.nn.Module):
    """A model with a layer its forward never uses: DDP waits for that layer's gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.used(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    mode = args.mode
    dist.init_process_group("gloo", timeout=timedelta(seconds=6))
    rank = dist.get_rank()
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {rank}: process group ready, world {dist.get_world_size()}", flush=True)
    if rank == 1:
        if mode == "raise":
            raise ValueError("tokenizer returned an empty sequence for sample 17")
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "segfault":
            import ctypes
            import faulthandler

            faulthandler.disable()
            ctypes.string_at(0)
        if mode == "segfault_fh":
            import ctypes
            import faulthandler

            faulthandler.enable()
            ctypes.string_at(0)
        if mode == "abort":
            os.abort()
        if mode == "oom_host":
            torch.empty(1 << 46, dtype=torch.uint8).fill_(1)
        if mode == "fds":
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
            keep = [open(__file__) for _ in range(100)]
            del keep
        if mode == "hang":
            time.sleep(60)
    if mode == "exit1":
        sys.exit(1)
    if mode == "sighup" and rank == 0:
        os.kill(os.getppid(), signal.SIGHUP)  # torchrun's terminal went away
        time.sleep(30)
    if mode == "unused":
        ddp = torch.nn.parallel.DistributedDataParallel(_HalfUsed())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            out = ddp(torch.ones(2, 4)).sum()
            out.backward()
            opt.step()
            opt.zero_grad()
            print(f"step {step} loss {out.item():.4f}", flush=True)
    loader = torch.utils.data.DataLoader(_Data(mode, rank), batch_size=4, num_workers=1)
    for step, batch in enumerate(loader, 1):
        loss = batch.mean() / (step * 10) + 1.0
        if mode == "nan" and step >= 3:
            loss = loss * float("nan")
        dist.all_reduce(loss)
        if rank == 0:
            print(
                {
                    "loss": round(loss.item() / 2, 4),
                    "grad_norm": 0.5,
                    "learning_rate": 1e-4,
                    "epoch": round(step / 16, 4),
                    "global_step/max_steps": f"{step}/{args.steps}",
                },
                flush=True,
            )
        if step == args.steps:
            break
        time.sleep(0.05)
    dist.barrier()
    if mode == "exit_abort" and rank == 1:
        # the last step done, the group left for exit to tear down: a C++ thread still
        # joinable there ends in std::terminate, the runtime's own message and SIGABRT
        print(f"rank {rank}: training finished", flush=True)
        import ctypes

        ctypes.CDLL("libstdc++.so.6")["_ZSt9terminatev"]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
