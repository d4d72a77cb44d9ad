"""Where a step's peak GPU memory goes: TUNEDECK_MEM_TRACE=DIR records the CUDA allocator's
history over the second step (the first one compiles and creates the optimizer's states) and
writes DIR/mem_peak_<run>_rank<R>.txt (<run>: the run folder's name, so one DIR serves
several runs): the live blocks at the step's peak, summed by the innermost
frame in model code (tunedeck, transformers, peft, bitsandbytes, torch.nn), largest first.
A debugging aid for the memory estimator; off unless the variable is set.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

OURS = (
    "tunedeck",
    "transformers",
    "peft",
    "bitsandbytes",
    "torch/nn/",
    "torch/optim",
    "torch/autograd",
    "torch/_functorch",
    "torch/_inductor",
)
STEP = 1  # record the step that starts after this many


def site(frames: list[dict]) -> str:
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in OURS) and "memtrace" not in name:
            short = name.split("site-packages/")[-1].split("/tunedeck/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "(other)"


def peak_sites(snapshot: dict, device: int = 0, top: int = 30) -> tuple[int, list]:
    """Replay the allocator trace: the most bytes live at once and, at that moment, the live
    blocks summed by site()."""
    trace = snapshot["device_traces"][device]
    live: dict[int, int] = {}
    cur = best = best_i = 0
    for i, ev in enumerate(trace):
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev["size"]
            cur += ev["size"]
            if cur > best:
                best, best_i = cur, i
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])
    alive: dict[int, dict] = {}
    for ev in trace[: best_i + 1]:
        if ev["action"] == "alloc":
            alive[ev["addr"]] = ev
        elif ev["action"] == "free_completed":
            alive.pop(ev["addr"], None)
    by = defaultdict(lambda: [0, 0])
    for ev in alive.values():
        s = by[site(ev.get("frames", []))]
        s[0] += ev["size"]
        s[1] += 1
    return best, sorted(by.items(), key=lambda kv: -kv[1][0])[:top]


def install(trainer) -> None:
    out = os.environ.get("TUNEDECK_MEM_TRACE")
    if not out or trainer.d.device.type != "cuda":
        return
    import torch

    tag = trainer.stop_file.parent.name or "run"  # the run folder

    def hook(step: int) -> None:
        if step == STEP:
            torch.cuda.memory._record_memory_history(max_entries=400_000)
        elif step == STEP + 1:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            best, rows = peak_sites(snap, torch.cuda.current_device())
            base = torch.cuda.memory_allocated()
            lines = [
                f"allocated between steps {base / 2**30:.2f} GiB; recorded step's peak "
                f"adds {best / 2**30:.2f} GiB (max_memory_allocated "
                f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB)"
            ]
            lines += [f"{b / 2**30:8.3f} GiB {n:6d} blocks  {s}" for s, (b, n) in rows]
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"mem_peak_{tag}_rank{trainer.d.rank}.txt").write_text(
                "\n".join(lines) + "\n"
            )

    trainer.before_step.append(hook)
