"""The adapter as r extra K columns of the frozen GEMM, against adding it in the epilogue.

Today's fused LoRA linear (`TUNEDECK_LORA_EPILOGUE=op`) writes the adapter's product into the
output and has the frozen GEMM accumulate onto it (beta = 1), and the backward does the same with
the input gradient. cuBLAS runs those beta-add GEMMs well below a bare one. The same sums are
bare GEMMs over one more block of K:

    y  = [x | s·x·Aᵀ]  · [W | B]ᵀ       (forward, K = in + r)
    dx = [dy | s·dy·B] · [W ; A]        (backward, K = out + r)

and both weight blocks are views of one persistent (out + r) × (in + r) buffer [[W, B], [A, 0]]
(so B and A could live in it). What that costs is copying x (or dy) into the wider operand,
unless whatever produces it writes there. Per projection of a Qwen2.5-7B layer (8,192 tokens,
r = 16): forward and backward input-gradient GEMMs timed bare, the epilogue way, the K-concat
way with its copy, and the K-concat GEMM alone (as if the producer wrote the wide operand);
the rank-r GEMMs x·Aᵀ and dy·B are in both adapter ways. CUDA events, median of --iters.

The attention block's question is printed last: q, k and v as three GEMMs against one merged
GEMM over [x | s·x·A_qᵀ | s·x·A_kᵀ | s·x·A_vᵀ] (forward and input-gradient backward, GEMMs only).

    python3 bench/lora_kcat.py [--tokens 8192] [--rank 16] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# median ms of CUDA events after warm-up; the per-projection benches' options
from lora_gemm import cuda_ms, operands, projection_args  # noqa: E402

WAYS = ("bare", "epilogue", "kcat", "kcat_gemm", "kcat64_gemm")


def projection(n: int, k: int, m: int, r: int, iters: int, s: float = 2.0) -> dict:
    """ms of each way, forward and backward, and the K-concat sums' error against epilogue's."""
    import torch

    dev, dt = "cuda", torch.bfloat16
    x, dy, w, a, b = operands(n, k, m, r)

    def buffer(ext: int) -> torch.Tensor:  # [[W, B, 0], [A, 0, 0], [0 ...]]
        wc = torch.zeros(m + ext, k + ext, device=dev, dtype=dt)
        wc[:m, :k], wc[:m, k : k + r], wc[m : m + r, :k] = w, b, a
        return wc

    wc, wc64 = buffer(r), buffer(64)
    xc, dyc = (
        torch.empty(n, k + r, device=dev, dtype=dt),
        torch.empty(n, m + r, device=dev, dtype=dt),
    )
    xc64, dyc64 = (
        torch.zeros(n, k + 64, device=dev, dtype=dt),
        torch.zeros(n, m + 64, device=dev, dtype=dt),
    )
    bs = (b * s).t().contiguous()
    as_ = a * s

    def f_epilogue():
        u = x @ a.t()
        return (u @ bs).addmm_(x, w.t())

    def f_kcat():
        u = x @ a.t()
        xc[:, :k].copy_(x)
        torch.mul(u, s, out=xc[:, k:])
        return xc @ wc[:m].t()

    def b_epilogue():
        g = dy @ b
        return (g @ as_).addmm_(dy, w)

    def b_kcat():
        g = dy @ b
        dyc[:, :m].copy_(dy)
        torch.mul(g, s, out=dyc[:, m:])
        return dyc @ wc[:, :k]

    f_kcat(), b_kcat()  # fill the wide operands for the GEMM-only rows
    xc64[:, : k + r], dyc64[:, : m + r] = xc, dyc
    err = {
        "forward": ((f_kcat() - f_epilogue()).float().norm() / f_epilogue().float().norm()).item(),
        "backward": ((b_kcat() - b_epilogue()).float().norm() / b_epilogue().float().norm()).item(),
    }
    fwd = {
        "bare": lambda: x @ w.t(),
        "epilogue": f_epilogue,
        "kcat": f_kcat,
        "kcat_gemm": lambda: xc @ wc[:m].t(),
        "kcat64_gemm": lambda: xc64 @ wc64[:m].t(),
    }
    bwd = {
        "bare": lambda: dy @ w,
        "epilogue": b_epilogue,
        "kcat": b_kcat,
        "kcat_gemm": lambda: dyc @ wc[:, :k],
        "kcat64_gemm": lambda: dyc64 @ wc64[:, :k],
    }
    return {
        "forward": {way: cuda_ms(fwd[way], iters) for way in WAYS},
        "backward": {way: cuda_ms(bwd[way], iters) for way in WAYS},
        "error": err,
    }


def qkv(n: int, r: int, iters: int, k: int = 3584, outs=(3584, 512, 512)) -> dict:
    """ms of q, k and v's forward and input-gradient GEMMs: bare and three, bare and merged, and
    merged with the three adapters as 3r extra K columns (as if the norm wrote the wide operand)."""
    import torch

    dev, dt = "cuda", torch.bfloat16
    m = sum(outs)
    x = torch.randn(n, k, device=dev, dtype=dt)
    xc = torch.randn(n, k + 3 * r, device=dev, dtype=dt)
    dy = torch.randn(n, m, device=dev, dtype=dt)
    dyc = torch.randn(n, m + 3 * r, device=dev, dtype=dt)
    w = torch.randn(m, k, device=dev, dtype=dt) * 0.02
    wc = torch.randn(m + 3 * r, k + 3 * r, device=dev, dtype=dt) * 0.02
    ws = list(w.split(outs))
    dys = [t.contiguous() for t in dy.split(outs, 1)]

    def three_f():
        return [x @ wi.t() for wi in ws]

    def three_b():
        return sum(d @ wi for d, wi in zip(dys, ws))

    ms = {
        "three": cuda_ms(three_f, iters) + cuda_ms(three_b, iters),
        "merged": cuda_ms(lambda: x @ w.t(), iters) + cuda_ms(lambda: dy @ w, iters),
        "merged_kcat": cuda_ms(lambda: xc @ wc[:m].t(), iters)
        + cuda_ms(lambda: dyc @ wc[:, :k], iters),
    }
    return ms


def main() -> None:
    a = projection_args()
    import torch
    from fp8_gemm import LINEARS  # (name, in, out) of one Qwen2.5-7B layer

    print(torch.__version__, torch.cuda.get_device_name())
    rows = {name: projection(a.tokens, k, m, a.rank, a.iters) for name, k, m in LINEARS}
    for part in ("forward", "backward"):
        print(f"{part:<10} " + " ".join(f"{w:>11}" for w in WAYS) + "  rel. err (kcat vs epilogue)")
        for name, row in rows.items():
            cells = " ".join(f"{row[part][w]:11.3f}" for w in WAYS)
            print(f"{name:<10} {cells}  {row['error'][part]:.1e}")
    tot = {w: sum(r[p][w] for r in rows.values() for p in ("forward", "backward")) for w in WAYS}
    print(
        "layer fwd+bwd ms: "
        + ", ".join(f"{w} {tot[w]:.3f}" for w in WAYS)
        + "; × 28 layers × 4 micro-batches, ms a step: "
        + ", ".join(f"{w} {tot[w] * 112:.0f}" for w in WAYS)
    )
    att = qkv(a.tokens, a.rank, a.iters)
    print("q, k, v fwd+bwd ms: " + ", ".join(f"{w} {v:.3f}" for w, v in att.items()))
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "layer": tot, "qkv": att}, indent=1))


if __name__ == "__main__":
    main()
