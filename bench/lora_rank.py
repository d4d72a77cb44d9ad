"""A LoRA linear's rank-r products: cuBLAS's four skinny GEMMs against core/train/lora_rank.py.

Per projection of a Qwen2.5-7B layer (8,192 tokens, r = 16), GPU time: each call captured
once in a CUDA graph and replayed, CUDA events, median of --iters (timed as eager calls,
the small kernels' launches from Python would be what is measured; in the trainer the CPU
runs ahead of the GPU):
- `fwd`: u = x·Aᵀ (cuBLAS `x @ a.t()` / lora_rank.rows);
- `bwd`: g = dy·B, dB = s·dyᵀ·u, dA = s·gᵀ·x (cuBLAS's three GEMMs / lora_rank.dy_pass + tn;
  `dy`: dy_pass + cuBLAS's gᵀ·x, TUNEDECK_LORA_RANK=dy);
each Triton kernel at every config of CONFIGS (the best is reported, and the one
lora_rank.CONFIG names), with the GB/s its bytes read make. Then the whole linear, forward +
backward as the trainer runs it (lora_triton.lora_forward / lora_backward: the persistent
kernel, autotuned, with either rank-r way), and the relative difference of g, dA, dB and u
against cuBLAS's.

    python3 bench/lora_rank.py [--tokens 8192] [--rank 16] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_gemm import cuda_ms, operands, projection_args  # noqa: E402


def gpu_ms(fn, iters: int) -> float:
    """fn's GPU time: warmed up (autotuning included), captured once in a CUDA graph, the
    graph's replays timed."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return cuda_ms(graph.replay, iters)


# (BM, BN, num_warps, num_stages) tried for each kernel
CONFIGS = {
    "dy": [(128, 128, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (64, 256, 8, 3), (128, 256, 8, 3),
           (256, 64, 8, 3), (64, 64, 4, 4), (128, 128, 8, 4)],
    "tn": [(128, 128, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (64, 256, 8, 3), (256, 128, 8, 3),
           (128, 256, 8, 3), (64, 64, 4, 4)],
    "rows": [(64, 128, 4, 3), (64, 256, 4, 3), (32, 256, 4, 3), (128, 128, 4, 3), (64, 64, 4, 4),
             (32, 128, 4, 4), (128, 64, 4, 4)],
}  # fmt: skip


def best(fn, kernel: str, iters: int) -> tuple[float, tuple, dict]:
    times = {}
    for c in CONFIGS[kernel]:
        try:
            times[c] = gpu_ms(lambda c=c: fn(c), iters)
        except Exception as e:  # a config the GPU cannot hold
            print(f"  {kernel} {c}: {type(e).__name__}: {str(e)[:100]}")
    c = min(times, key=times.get)
    return times[c], c, {str(k): round(v, 4) for k, v in times.items()}


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    a = projection_args()
    import torch
    from fp8_gemm import LINEARS  # (name, in, out) of one Qwen2.5-7B layer

    from tunedeck.core.train import lora_rank, lora_triton

    print(torch.__version__, torch.cuda.get_device_name())
    n, r, s = a.tokens, a.rank, 2.0
    out = {"rows": {}, "configs": {}}
    print(f"{'proj':<6} {'fwd cuBLAS':>10} {'triton':>8} {'bwd cuBLAS':>10} {'dy':>6} {'triton':>8}"
          f" {'GB/s fwd':>8} {'bwd':>6} {'linear cuBLAS':>13} {'dy':>6} {'triton':>8}   (ms)")  # fmt: skip
    for name, k, m in LINEARS:
        x, dy, w, aa, b = operands(n, k, m, r)
        u = x @ aa.t()

        def cub_bwd():
            g = dy @ b
            return g, (dy.t() @ u) * s, (g.t() @ x) * s

        f_cub = gpu_ms(lambda: x @ aa.t(), a.iters)
        b_cub = gpu_ms(cub_bwd, a.iters)
        b_dy = gpu_ms(lambda: (lora_rank.dy_pass(dy, b, u, s)[0].t() @ x) * s, a.iters)
        f_tri, f_c, f_all = best(lambda c: lora_rank.rows(x, aa, c), "rows", a.iters)
        d_tri, d_c, d_all = best(lambda c: lora_rank.dy_pass(dy, b, u, s, c), "dy", a.iters)
        g = dy @ b
        t_tri, t_c, t_all = best(lambda c: lora_rank.tn(g, x, s, c), "tn", a.iters)
        default = {
            "rows": gpu_ms(lambda: lora_rank.rows(x, aa), a.iters),
            "bwd": gpu_ms(lambda: lora_rank.tn(lora_rank.dy_pass(dy, b, u, s)[0], x, s), a.iters),
        }
        gt, dbt = lora_rank.dy_pass(dy, b, u, s)
        g_c, db_c, da_c = cub_bwd()
        err = {
            "u": rel(lora_rank.rows(x, aa), u),
            "g": rel(gt, g_c),
            "dB": rel(dbt, db_c),
            "dA": rel(lora_rank.tn(gt, x, s), da_c),
        }
        # the whole linear as the trainer's op runs it, cuBLAS's rank-r products or ours
        lin = {}
        for way in ("cublas", "dy", "triton"):
            os.environ["TUNEDECK_LORA_RANK"] = way

            def linear():
                y, uu = lora_triton.lora_forward(x, w, None, aa, b, s)
                return lora_triton.lora_backward(dy, x, w, aa, b, uu, s)

            lin[way] = gpu_ms(linear, a.iters)
        os.environ.pop("TUNEDECK_LORA_RANK")
        gb_f = n * k * 2 / 1e6 / f_tri  # x once (GB/s = MB/ms)
        gb_b = (n * m * 2 + n * k * 2) / 1e6 / (d_tri + t_tri)  # dy once, x once
        row = {
            "fwd_cublas": f_cub, "fwd_triton": f_tri, "fwd_config": f_c,
            "bwd_cublas": b_cub, "bwd_dy": b_dy, "bwd_triton": d_tri + t_tri, "dy_config": d_c,
            "tn_config": t_c,
            "dy_ms": d_tri, "tn_ms": t_tri, "default": default,
            "linear_cublas": lin["cublas"], "linear_dy": lin["dy"], "linear_triton": lin["triton"],
            "rel": err,
        }  # fmt: skip
        out["rows"][name] = row
        out["configs"][name] = {"rows": f_all, "dy": d_all, "tn": t_all}
        print(f"{name:<6} {f_cub:10.3f} {f_tri:8.3f} {b_cub:10.3f} {b_dy:6.3f} {d_tri + t_tri:8.3f}"
              f" {gb_f:8.0f} {gb_b:6.0f} {lin['cublas']:13.3f} {lin['dy']:6.3f} {lin['triton']:8.3f}"
              f"   best {f_c} {d_c} {t_c}; default rows {default['rows']:.3f} bwd"
              f" {default['bwd']:.3f}; rel " + " ".join(f"{k} {v:.1e}" for k, v in err.items()))  # fmt: skip
    tot = {
        k: sum(r[k] for r in out["rows"].values())
        for k in ("fwd_cublas", "fwd_triton", "bwd_cublas", "bwd_dy", "bwd_triton",
                  "linear_cublas", "linear_dy", "linear_triton")
    }  # fmt: skip
    out["layer"] = tot
    print("layer  " + ", ".join(f"{k} {v:.3f}" for k, v in tot.items()))
    print("× 112 (a step of the preset), ms: "
          + ", ".join(f"{k} {v * 112:.0f}" for k, v in tot.items()))  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
