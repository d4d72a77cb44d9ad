"""The frozen matmuls of a LoRA step in bf16 against fp8 with row-wise scales (one GPU).

    python3 bench/fp8_gemm.py [--tokens 8192] [--json OUT.json]

For each linear of a Qwen2.5-7B layer: the forward x·Wᵀ and the input gradient dy·W, timed
as bf16 torch.mm and as torch._scaled_mm on e4m3 operands with one scale per row of the
activation and one per output (forward) or input (backward) channel of the weight, plus the
cost of quantizing the activation (compiled amax + scale + cast). Decides whether an fp8 base
can buy what the bf16 step cannot (issue 17: matmuls are ~86 % of the bf16 peak already).
"""

from __future__ import annotations

import argparse
import json

import torch

E4M3 = torch.float8_e4m3fn
FMAX = torch.finfo(E4M3).max

# (name, in, out) of one Qwen2.5-7B decoder layer
LINEARS = [
    ("q", 3584, 3584),
    ("k", 3584, 512),
    ("v", 3584, 512),
    ("o", 3584, 3584),
    ("gate", 3584, 18944),
    ("up", 3584, 18944),
    ("down", 18944, 3584),
]


def quant_rows(t: torch.Tensor):
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = FMAX / amax
    return (t.float() * scale).clamp(-FMAX, FMAX).to(E4M3), scale.reciprocal()


def timed(fn, reps=20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--json")
    args = ap.parse_args()
    m = args.tokens
    dev = torch.device("cuda")
    q = torch.compile(quant_rows)
    rows, tot = [], {"bf16": 0.0, "fp8": 0.0, "fp8_fast": 0.0, "quant": 0.0, "flop": 0.0}
    for name, k, n in LINEARS:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16) * 1e-3
        w8, sw = quant_rows(w)  # (n, k), scale per output channel
        wt8, swt = quant_rows(w.t().contiguous())  # (k, n), scale per input channel
        x8, sx = q(x)
        dy8, sdy = q(dy)
        r = {"linear": name, "in": k, "out": n}
        r["bf16_fwd_ms"] = timed(lambda: x @ w.t())
        r["bf16_bwd_ms"] = timed(lambda: dy @ w)
        for tag, fast in (("fp8", False), ("fp8_fast", True)):
            r[f"{tag}_fwd_ms"] = timed(
                lambda: torch._scaled_mm(
                    x8,
                    w8.t(),
                    scale_a=sx,
                    scale_b=sw.t(),
                    out_dtype=torch.bfloat16,
                    use_fast_accum=fast,
                )
            )
            r[f"{tag}_bwd_ms"] = timed(
                lambda: torch._scaled_mm(
                    dy8,
                    wt8.t(),
                    scale_a=sdy,
                    scale_b=swt.t(),
                    out_dtype=torch.bfloat16,
                    use_fast_accum=fast,
                )
            )
        r["quant_x_ms"] = timed(lambda: q(x))
        r["quant_dy_ms"] = timed(lambda: q(dy))
        ref = x.float() @ w.float().t()
        got = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)
        r["fwd_rel_err"] = float((got.float() - ref).norm() / ref.norm())
        flop = 2 * m * k * n
        for key, fk, bk in (
            ("bf16", "bf16_fwd_ms", "bf16_bwd_ms"),
            ("fp8", "fp8_fwd_ms", "fp8_bwd_ms"),
            ("fp8_fast", "fp8_fast_fwd_ms", "fp8_fast_bwd_ms"),
        ):
            tot[key] += r[fk] + r[bk]
            r[f"{key}_tflops"] = round(2 * flop / (r[fk] + r[bk]) / 1e9, 1)
        tot["quant"] += r["quant_x_ms"] + r["quant_dy_ms"]
        tot["flop"] += 2 * flop
        rows.append(r)
        print(
            f"{name:5} {k:6}->{n:6}  bf16 {r['bf16_fwd_ms']:.3f}+{r['bf16_bwd_ms']:.3f} ms "
            f"({r['bf16_tflops']} TF/s)  fp8 {r['fp8_fwd_ms']:.3f}+{r['fp8_bwd_ms']:.3f} "
            f"({r['fp8_tflops']})  fast {r['fp8_fast_tflops']}  quant "
            f"{r['quant_x_ms']:.3f}+{r['quant_dy_ms']:.3f}  err {r['fwd_rel_err']:.4f}",
            flush=True,
        )
    layers = 28
    print(
        f"per layer: bf16 {tot['bf16']:.2f} ms, fp8 {tot['fp8']:.2f} ms, fp8 fast accum "
        f"{tot['fp8_fast']:.2f} ms, activation quantization {tot['quant']:.2f} ms"
    )
    print(
        f"x{layers} layers: bf16 {tot['bf16'] * layers:.0f} ms, fp8 "
        f"{(tot['fp8'] + tot['quant']) * layers:.0f} ms with quantization, fast "
        f"{(tot['fp8_fast'] + tot['quant']) * layers:.0f} ms"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "tokens": m,
                    "rows": rows,
                    "per_layer_ms": tot,
                    "device": torch.cuda.get_device_name(),
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
