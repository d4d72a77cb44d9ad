"""One Triton kernel a LoRA linear (core/train/lora_triton.py) against cuBLAS and the default.

Per projection of a Qwen2.5-7B layer (8,192 tokens, r = 16), forward + backward (dx, dA, dB):
- `bare`: the frozen GEMMs alone through cuBLAS (x·Wᵀ and dy·W), the floor the others pay;
- `op`: the trainer's default fused linear (TUNEDECK_LORA_EPILOGUE=op: cuBLAS, the adapter's
  product as the GEMM's C operand);
- `tbare`: the Triton kernel with the adapter off, the best of lora_triton.CONFIGS per GEMM
  (how far Triton's own GEMM is from cuBLAS's);
- `loop`: the kernel with the adapter's rank-r product in its main loop, the best config per
  GEMM, plus dA and dB through cuBLAS;
- `epilogue`: the rank-r products x·Aᵀ and dy·B by cuBLAS, the kernel adding s·u·Bᵀ (s·g·A) in
  its epilogue, dA and dB by cuBLAS (lora_triton.MODE, what TUNEDECK_LORA_EPILOGUE=triton runs,
  autotuned).
Records each config's ms for each kernel, and prints the relative error of each mode's y and
dx against `op`'s. CUDA events, median of --iters.

    python3 bench/lora_triton.py [--tokens 8192] [--rank 16] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_gemm import cuda_ms  # noqa: E402  (median ms of CUDA events after warm-up)

WAYS = ("bare", "op", "tbare", "loop", "epilogue")


def projection(n: int, k: int, m: int, r: int, iters: int, s: float = 2.0) -> dict:
    import torch

    from tunedeck.core.train import lora_fused as lf
    from tunedeck.core.train import lora_triton as lt

    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(n, k, device=dev, dtype=dt)
    dy = torch.randn(n, m, device=dev, dtype=dt)
    w = torch.randn(m, k, device=dev, dtype=dt) * 0.02
    a = torch.randn(r, k, device=dev, dtype=dt) * 0.02
    b = torch.randn(m, r, device=dev, dtype=dt) * 0.02
    u = x @ a.t()
    out: dict = {"configs": {}}

    def best(fn) -> tuple[float, tuple]:
        times = {}
        for c in lt.CONFIGS:
            try:
                times[c] = cuda_ms(lambda c=c: fn(c), iters)
            except Exception as e:  # a config the GPU cannot hold (shared memory)
                print(f"  config {c}: {type(e).__name__}: {str(e)[:120]}")
        c = min(times, key=times.get)
        return times[c], c, times

    g = dy @ b
    kernels = {
        "fwd_bare": lambda c: lt.lora_mm(x, w.t(), None, None, s, None, c),
        "bwd_bare": lambda c: lt.lora_mm(dy, w, None, None, s, None, c),
        "fwd_loop": lambda c: lt.lora_mm(x, w.t(), a.t(), b.t(), s, None, c, "loop"),
        "bwd_loop": lambda c: lt.lora_mm(dy, w, b, a, s, None, c, "loop"),
        "fwd_epilogue": lambda c: lt.lora_mm(x, w.t(), u, b.t(), s, None, c, "epilogue"),
        "bwd_epilogue": lambda c: lt.lora_mm(dy, w, g, a, s, None, c, "epilogue"),
    }
    tuned = {}
    for name, fn in kernels.items():
        tuned[name] = best(fn)
        out["configs"][name] = {str(c): round(ms, 4) for c, ms in tuned[name][2].items()}
        out[f"{name}_best"] = [tuned[name][0], list(tuned[name][1])]
    out["bare"] = cuda_ms(lambda: (x @ w.t(), dy @ w), iters)
    out["op"] = cuda_ms(
        lambda: (
            lf.adapter_linear(x, w, None, a, b, s, False, 0.0),
            lf.adapter_linear_backward(dy, x, w, a, b, u, s, False, None, 0.0),
        ),
        iters,
    )
    out["tbare"] = tuned["fwd_bare"][0] + tuned["bwd_bare"][0]
    y_op = lf.adapter_linear(x, w, None, a, b, s, False, 0.0)[0].float()
    dx_op = lf.adapter_linear_backward(dy, x, w, a, b, u, s, False, None, 0.0)[0].float()
    for mode in ("loop", "epilogue"):
        cf, cb = tuned[f"fwd_{mode}"][1], tuned[f"bwd_{mode}"][1]
        out[mode] = cuda_ms(
            lambda: (
                lt.lora_forward(x, w, None, a, b, s, cf, mode),
                lt.lora_backward(dy, x, w, a, b, u, s, cb, mode),
            ),
            iters,
        )
        y_t = lt.lora_forward(x, w, None, a, b, s, cf, mode)[0].float()
        dx_t = lt.lora_backward(dy, x, w, a, b, u, s, cb, mode)[0].float()
        out[f"err_{mode}"] = [
            ((y_t - y_op).norm() / y_op.norm()).item(),
            ((dx_t - dx_op).norm() / dx_op.norm()).item(),
        ]
    out["tflops_bare"] = 4 * n * k * m / out["bare"] / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch
    import triton
    from fp8_gemm import LINEARS  # (name, in, out) of one Qwen2.5-7B layer

    print(torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    rows = {}
    for name, k, m in LINEARS:
        rows[name] = projection(args.tokens, k, m, args.rank, args.iters)
        row = rows[name]
        print(
            f"{name:<6} "
            + " ".join(f"{w} {row[w]:.3f}" for w in WAYS)
            + f"  (ms fwd+bwd; cuBLAS {row['tflops_bare']:.0f} TFLOP/s)"
            + "  kernels "
            + " ".join(f"{k[:-5]} {v[0]:.3f}" for k, v in row.items() if k.endswith("_best"))
            + f"  err y, dx: loop {row['err_loop']} epilogue {row['err_epilogue']}"
        )
    tot = {w: sum(r[w] for r in rows.values()) for w in WAYS}
    print("layer  " + " ".join(f"{w} {tot[w]:.3f}" for w in WAYS))
    print(
        "× 28 layers × 4 micro-batches, ms a step: "
        + ", ".join(f"{w} {tot[w] * 112:.0f}" for w in WAYS)
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "layer": tot}, indent=1))


if __name__ == "__main__":
    main()
