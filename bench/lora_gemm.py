"""One fused LoRA linear at the 7B preset's shapes: the ways of adding the adapter, timed.

For each projection of a Qwen2.5-7B layer (8,192 tokens a micro-batch, LoRA r=16), forward and
backward of `core/train/lora_fused.py`'s layer in each TUNEDECK_LORA_EPILOGUE way, against the
bare frozen GEMMs (x·Wᵀ and dy·W, no adapter): where the adapter's cost is, per projection, before
a whole trainer run. CUDA events, median of --iters after warm-up; eager (the trainer compiles
the layers around these ops, which the ops themselves are opaque to).

    python3 bench/lora_gemm.py [--tokens 8192] [--rank 16] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()

WAYS = ("bare", "1", "0", "op", "after")


def cuda_ms(fn, iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    out = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def projection_args(**extra) -> argparse.Namespace:
    """The per-projection benches' options (one 7B layer's linears at --tokens, rank --rank,
    median of --iters), plus `extra` as {flag: default}."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path)
    for flag, default in extra.items():
        ap.add_argument(f"--{flag}", default=default)
    return ap.parse_args()


def operands(n: int, k: int, m: int, r: int) -> tuple:
    """(x, dy, W, A, B) of one projection, in → out = k → m, n tokens, rank r: bf16 on the GPU."""
    import torch

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale

    return (
        rand(n, k),
        rand(n, m),
        rand(m, k, scale=0.02),
        rand(r, k, scale=0.02),
        rand(m, r, scale=0.02),
    )


def layer_totals(rows: dict, ways, label: str = "layer") -> dict:
    """Print each way's ms summed over a layer's projections and over a 7B preset step."""
    tot = {w: sum(r[w] for r in rows.values()) for w in ways}
    print(f"{label:<10} " + " ".join(f"{w} {tot[w]:.3f}" for w in ways))
    print(
        "× 28 layers × 4 micro-batches, ms a step: "
        + ", ".join(f"{w} {tot[w] * 112:.0f}" for w in ways)
    )
    return tot


def one(way: str, n: int, k: int, m: int, r: int, iters: int) -> float:
    """ms for forward + backward of one projection done `way`."""
    import torch

    from tunedeck.core.train import lora_fused as lf

    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(n, k, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(m, k, device=dev, dtype=dt) * 0.02
    a = (torch.randn(r, k, device=dev, dtype=dt) * 0.02).requires_grad_()
    b = (torch.randn(m, r, device=dev, dtype=dt) * 0.02).requires_grad_()
    dy = torch.randn(n, m, device=dev, dtype=dt)

    def bare():
        y = x.detach() @ w.t()
        return y, dy @ w

    def fused():
        x.grad = a.grad = b.grad = None
        if way in ("op", "after"):
            y, _, _ = lf.lora_linear(x, w, None, a, b, 2.0, way == "after", 0.0)
        else:
            y = lf._LoraLinear.apply(x, w, None, a, b, 2.0, way == "1")
        y.backward(dy)

    return cuda_ms(bare if way == "bare" else fused, iters)


def main() -> None:
    a = projection_args()
    import torch
    from fp8_gemm import LINEARS  # (name, in, out) of one Qwen2.5-7B layer

    print(torch.__version__, torch.cuda.get_device_name())
    rows = {}
    print("projection " + " ".join(f"{w:>8}" for w in WAYS) + "   (ms, forward + backward)")
    for name, k, m in LINEARS:
        rows[name] = {w: one(w, a.tokens, k, m, a.rank, a.iters) for w in WAYS}
        print(f"{name:<10} " + " ".join(f"{rows[name][w]:8.3f}" for w in WAYS))
    tot = layer_totals(rows, WAYS)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "layer": tot}, indent=1))


if __name__ == "__main__":
    main()
