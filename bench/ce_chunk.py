"""The output head's per-chunk cross-entropy (core/train/ce_kernel.py): eager against compiled.

Times one micro-batch of linear_cross_entropy's chunk math at the 7B preset's shape (8,192
labelled rows in 3 chunks of 2,731, hidden 3,584, vocabulary 152,064, bf16, head frozen so
only d/dh is made), the head matmul alone, and the peak memory of each path; checks that both
paths agree. CUDA events, median of --iters after warm-up (the first call compiles).

    python3 bench/ce_chunk.py [--device cuda] [--rows 8192] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=3584)
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()

    import os

    import torch

    from tunedeck.core.train import ce_kernel
    from tunedeck.core.train.parallel import IGNORE, linear_cross_entropy

    dev = torch.device(a.device)
    if dev.type != "cuda":
        os.environ.setdefault("TUNEDECK_COMPILE_BACKEND", "inductor")
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(a.vocab, a.hidden, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
    h = torch.randn(a.rows, a.hidden, device=dev, generator=g, dtype=torch.bfloat16)
    t = torch.randint(0, a.vocab, (a.rows,), device=dev, generator=g)
    t_ign = t.clone()
    t_ign[::5] = IGNORE
    h.requires_grad_(True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        out = []
        for i in range(a.iters + 2):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if i >= 2:
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    def step(tt, all_valid):
        h.grad = None
        linear_cross_entropy(h, w, tt, all_valid=all_valid).backward()

    res = {"rows": a.rows, "hidden": a.hidden, "vocab": a.vocab, "device": str(dev)}
    hd = h.detach()

    def mm_only():  # the matmuls the loss makes whatever the pointwise path: logits and d/dh
        for s in range(0, a.rows, 2731):
            lg = hd[s : s + 2731] @ w.t()
            lg @ w

    res["matmuls_ms"] = timed(mm_only)
    grads = {}
    for mode in ("0", "1"):
        os.environ[ce_kernel.FUSED_ENV] = mode
        ce_kernel.reset()
        for name, tt, av in (("all_valid", t, True), ("ignore", t_ign, False)):
            t0 = time.perf_counter()
            step(tt, av)
            sync()
            first = time.perf_counter() - t0
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            ms = timed(lambda: step(tt, av))
            key = f"{'fused' if mode == '1' else 'eager'}_{name}"
            res[key + "_ms"] = ms
            res[key + "_first_s"] = first
            if dev.type == "cuda":
                res[key + "_peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
            h.grad = None
            with torch.no_grad():
                res[key + "_loss"] = float(linear_cross_entropy(hd, w, tt, all_valid=av))
            step(tt, av)
            grads[key] = h.grad.float().clone()
    for name in ("all_valid", "ignore"):
        d = (grads[f"fused_{name}"] - grads[f"eager_{name}"]).abs().max().item()
        res[f"max_abs_grad_diff_{name}"] = d
        res[f"grad_scale_{name}"] = grads[f"eager_{name}"].abs().max().item()
    if dev.type == "cuda":  # the kernels of one step, per path (names and summed times)
        from torch.profiler import ProfilerActivity, profile

        for mode in ("0", "1"):
            os.environ[ce_kernel.FUSED_ENV] = mode
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step(t_ign, False)
                sync()
            print(f"-- {ce_kernel.FUSED_ENV}={mode}, IGNORE rows, one micro-batch")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    res["compile_failed"] = ce_kernel._failed
    from torch._dynamo.utils import counters

    res["graphs"] = int(counters["stats"]["unique_graphs"])
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
