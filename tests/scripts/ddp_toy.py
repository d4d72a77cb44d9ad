"""A small plain-torch DDP training script for the live-detector and probe tests.

Run by real torchrun (gloo, CPU). Writes the built-in event schema (core/rundir/events.py) to
$TUNEDECK_RUN_DIR/events/rank<r>.jsonl unless --no-events, and can misbehave on purpose:
  --delay-rank R --delay-s S   rank R's dataset sleeps S seconds per batch (a starved loader)
  --hang-rank R --hang-at N    rank R stops making progress after step N (sleeps forever)
  --print-metrics              rank 0 prints HF Trainer's log dicts (a script tunedeck only reads)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Toy(Dataset):
    def __init__(self, n: int, delay_s: float):
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum().reshape(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-sleep", type=float, default=0.05, help="simulated compute per step")
    ap.add_argument("--delay-rank", type=int, default=-1)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--no-events", action="store_true")
    ap.add_argument("--print-metrics", action="store_true")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    writer = None
    if not a.no_events:
        from tunedeck.core.rundir.events import EventWriter

        writer = EventWriter(os.environ["TUNEDECK_RUN_DIR"], rank)
        writer.emit(
            "start",
            world_size=world,
            device="cpu",
            model="toy",
            method="full",
            dtype="float32",
            trainable_params=17,
            total_params=17,
            max_steps=a.steps,
            restart=0,
        )
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ds = Toy(10**6, a.delay_s if rank == a.delay_rank else 0.0)
    dl = DataLoader(ds, batch_size=1, num_workers=a.workers)
    it = iter(dl)
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        x, y = next(it)
        wait = time.perf_counter() - t0
        if rank == a.hang_rank and step > a.hang_at:
            while True:  # stuck: never reaches the all-reduce
                time.sleep(1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # the gradient all-reduce: every rank waits for the slowest
        opt.step()
        time.sleep(a.step_sleep)
        if writer:
            s = time.perf_counter() - t0
            writer.emit(
                "step",
                step=step,
                loss=float(loss),
                lr=1e-3,
                grad_norm=0.0,
                tokens=16,
                step_s=s,
                data_wait_s=wait,
                mem_gib=0.0,
                tokens_per_s=16 / s,
            )
        if a.print_metrics and rank == 0:
            print({"loss": round(float(loss), 6), "learning_rate": 1e-3, "epoch": step / a.steps})
    if a.print_metrics and rank == 0:
        print({"eval_loss": round(float(loss), 6), "epoch": 1.0}, flush=True)
    if writer:
        writer.emit("end", step=a.steps, reason="completed", loss=float(loss))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
