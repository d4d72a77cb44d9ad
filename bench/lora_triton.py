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
  its epilogue, dA and dB by cuBLAS;
- `persistent`: the same through the persistent TMA kernel (lora_triton.MODE, what
  TUNEDECK_LORA_EPILOGUE=triton runs, autotuned);
- `persistent-loop`: the persistent kernel computing x·Aᵀ (dy·B) in its main loop too, so
  only dA and dB remain for cuBLAS (TUNEDECK_LORA_EPILOGUE=triton-loop).
Records each config's ms for each kernel, and prints the relative error of each mode's y and
dx against `op`'s. CUDA events, median of --iters.

`--modes ...,tma,ws`: the persistent kernel with its output tiles stored by TMA, whole or in
halves (lora_triton.GEMM_CONFIGS["tma"]), and with the tile loop warp-specialized too ("ws");
each reported beside `persistent` (masked pointer stores, what "pointer" runs).

`--modes ...,fp8` (or `fp8` alone) also times the fp8 base's two products a projection (x·Wᵀ
and dy·W, e4m3 with per-row scales, the adapter's s·u·Bᵀ and s·g·A added): `fp8bare` is
cuBLAS's `_scaled_mm` alone, `fp8op` what the fp8 layer runs by default (lora_fused.
scaled_mm_add: `_scaled_mm`, then the adapter added in place by a second GEMM), `fp8triton`
the persistent kernel with the scales and the adapter's K step (lora_triton.scaled_lora_mm,
TUNEDECK_LORA_EPILOGUE=triton with method.fp8_base), the best of lora_triton.PERSISTENT_FP8
per product. The quantization of x and dy and the rank-r GEMMs, the same either way, are left
out.

`--modes ...,wide` times q/k/v and gate/up as groups (TUNEDECK_LORA_EPILOGUE=triton-wide):
`each` is the sum of the group's projections run one kernel each (`triton`, autotuned), `one`
the group as one kernel over the stacked weights with the block-diagonal adapter K step.

    python3 bench/lora_triton.py [--tokens 8192] [--rank 16] [--iters 20] [--json OUT]
        [--modes persistent[,persistent-loop,epilogue,loop,fp8,wide]]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# median ms of CUDA events after warm-up; the per-projection benches' options and totals
from lora_gemm import cuda_ms, layer_totals, operands, projection_args  # noqa: E402

# the Triton bare GEMM each mode's kernel is timed against
BARE = {
    "loop": "tbare",
    "epilogue": "tbare",
    "persistent": "pbare",
    "persistent-loop": "pbare",
    "tma": "pbare",
    "ws": "pbare",
}
# the layer mode each bench mode runs: tma and ws are the persistent kernel at other configs
LAYER_MODE = {"tma": "persistent", "ws": "persistent"}


def sweep(out: dict, key: str, fn, configs, iters: int) -> tuple:
    """Time fn(config) at each of `configs` (one the GPU cannot hold is reported and skipped);
    record every time under out["configs"][key] and the best as out[key + "_best"]; the best
    config."""
    times = {}
    for c in configs:
        try:
            times[c] = cuda_ms(lambda c=c: fn(c), iters)
        except Exception as e:  # a config the GPU cannot hold (shared memory)
            print(f"  config {c}: {type(e).__name__}: {str(e)[:120]}")
    c = min(times, key=times.get)
    out["configs"][key] = {str(k): round(v, 4) for k, v in times.items()}
    out[f"{key}_best"] = [times[c], list(c)]
    return c


def projection(n: int, k: int, m: int, r: int, iters: int, modes, s: float = 2.0) -> dict:
    from tunedeck.core.train import lora_fused as lf
    from tunedeck.core.train import lora_triton as lt

    x, dy, w, a, b = operands(n, k, m, r)
    u, g = x @ a.t(), dy @ b
    out: dict = {"configs": {}}
    tiled, persistent = lt.lora_mm, lt.lora_mm_persistent
    # kernel name -> (forward or input gradient at a config, configs to sweep)
    kernels = {
        "tbare": (
            lambda c: tiled(x, w.t(), None, None, s, None, c),
            lambda c: tiled(dy, w, None, None, s, None, c),
            lt.CONFIGS,
        ),
        "pbare": (
            lambda c: persistent(x, w.t(), None, None, s, None, c),
            lambda c: persistent(dy, w, None, None, s, None, c),
            lt.PERSISTENT,
        ),
        "loop": (
            lambda c: tiled(x, w.t(), a.t(), b.t(), s, None, c, "loop"),
            lambda c: tiled(dy, w, b, a, s, None, c, "loop"),
            lt.CONFIGS,
        ),
        "epilogue": (
            lambda c: tiled(x, w.t(), u, b.t(), s, None, c, "epilogue"),
            lambda c: tiled(dy, w, g, a, s, None, c, "epilogue"),
            lt.CONFIGS,
        ),
        "persistent": (
            lambda c: persistent(x, w.t(), u, b.t(), s, None, c),
            lambda c: persistent(dy, w, g, a, s, None, c),
            lt.PERSISTENT,
        ),
        "persistent-loop": (
            lambda c: persistent(x, w.t(), None, b.t(), s, None, c, a.t()),
            lambda c: persistent(dy, w, None, a, s, None, c, b),
            lt.PERSISTENT,
        ),
    }
    for name in ("tma", "ws"):  # the persistent kernel, its output stored by TMA (/ and WS)
        kernels[name] = (*kernels["persistent"][:2], lt.GEMM_CONFIGS[name])

    picked = {}
    for name in dict.fromkeys([*(BARE[mode] for mode in modes), *modes]):
        fwd, bwd, configs = kernels[name]
        for part, fn in (("fwd", fwd), ("bwd", bwd)):
            picked[f"{part}_{name}"] = sweep(out, f"{part}_{name}", fn, configs, iters)
        if name in BARE.values():
            out[name] = out[f"fwd_{name}_best"][0] + out[f"bwd_{name}_best"][0]
    out["bare"] = cuda_ms(lambda: (x @ w.t(), dy @ w), iters)

    def op():
        y = lf.adapter_linear(x, w, None, a, b, s, False, 0.0)[0]
        return y, lf.adapter_linear_backward(dy, x, w, a, b, u, s, False, None, 0.0)[0]

    out["op"] = cuda_ms(op, iters)
    y_op, dx_op = (t.float() for t in op())
    for mode in modes:
        cf, cb = picked[f"fwd_{mode}"], picked[f"bwd_{mode}"]

        def fused(mode=mode, cf=cf, cb=cb):
            layer = LAYER_MODE.get(mode, mode)
            y = lt.lora_forward(x, w, None, a, b, s, cf, layer)[0]
            return y, lt.lora_backward(dy, x, w, a, b, u, s, cb, layer)[0]

        out[mode] = cuda_ms(fused, iters)
        y_t, dx_t = (t.float() for t in fused())
        out[f"err_{mode}"] = [
            round(((y_t - y_op).norm() / y_op.norm()).item(), 5),
            round(((dx_t - dx_op).norm() / dx_op.norm()).item(), 5),
        ]
    out["tflops_bare"] = 4 * n * k * m / out["bare"] / 1e9
    return out


def projection_fp8(n: int, k: int, m: int, r: int, iters: int, s: float = 2.0) -> dict:
    """The fp8 base's forward and input-gradient products of one projection, three ways (the
    module docstring), with each PERSISTENT_FP8 config's ms and the error against `fp8op`."""
    import torch

    from tunedeck.core.train import lora_fused as lf
    from tunedeck.core.train import lora_triton as lt

    x, dy, w, a, b = operands(n, k, m, r)
    (x8, sx), (dy8, sdy) = lf.quant_rows(x), lf.quant_rows(dy)
    w8, sw = lf.quant_rows(w.contiguous())
    wt8, swt = lf.quant_rows(w.t().contiguous())
    sw, swt = sw.t().contiguous(), swt.t().contiguous()
    bs = b.t() * s
    u, g = x @ a.t(), dy @ bs.t()
    fwd_args, bwd_args = (x8, sx, w8.t(), sw, None, u, bs), (dy8, sdy, wt8.t(), swt, None, g, a)
    out: dict = {"configs": {}}

    def scaled(a8, sa, b8, sb, _bias, _u, _v):
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    def kernel(c, a8, sa, b8, sb, bias, u_, v):
        return lt.lora_mm_persistent(a8, b8, u_, v, 1.0, bias, c, scales=(sa, sb))[0]

    for part, args in (("fwd", fwd_args), ("bwd", bwd_args)):
        c = sweep(
            out,
            f"{part}_fp8triton",
            lambda c, args=args: kernel(c, *args),
            lt.PERSISTENT_FP8,
            iters,
        )
        for way, fn in (("fp8bare", scaled), ("fp8op", lf.scaled_mm_add)):
            out[f"{part}_{way}"] = cuda_ms(lambda fn=fn, args=args: fn(*args), iters)
        ref, got = lf.scaled_mm_add(*args).float(), kernel(c, *args).float()
        out[f"err_{part}_fp8triton"] = round(((got - ref).norm() / ref.norm()).item(), 5)
    for way in ("fp8bare", "fp8op"):
        out[way] = out[f"fwd_{way}"] + out[f"bwd_{way}"]
    out["fp8triton"] = out["fwd_fp8triton_best"][0] + out["bwd_fp8triton_best"][0]
    return out


FP8_WAYS = ("fp8bare", "fp8op", "fp8triton")
# the groups triton-wide runs as one kernel: (name, input width, each projection's outputs)
GROUPS = (("qkv", 3584, (3584, 512, 512)), ("gate_up", 3584, (18944, 18944)))


def group(n: int, k: int, outs: tuple[int, ...], r: int, iters: int, s: float = 2.0) -> dict:
    """ms forward + backward of a group's projections one kernel each, and as one kernel."""
    import torch

    from tunedeck.core.train import lora_triton as lt

    parts = [operands(n, k, m, r) for m in outs]
    x = parts[0][0]
    dy = torch.cat([p[1] for p in parts], 1)
    w, a, b = (torch.cat([p[i] for p in parts]) for i in (2, 3, 4))
    sizes = list(outs)

    def each():
        for _, dyi, wi, ai, bi in parts:
            y, u = lt.lora_forward(x, wi, None, ai, bi, s)
            lt.lora_backward(dyi, x, wi, ai, bi, u, s)

    def one():
        y, u = lt.lora_forward(x, w, None, a, b, s, sizes=sizes)
        return y, lt.lora_backward(dy, x, w, a, b, u, s, sizes=sizes)

    out = {"each": cuda_ms(each, iters), "one": cuda_ms(one, iters)}
    y = one()[0]
    y_each = torch.cat([lt.lora_forward(x, p[2], None, p[3], p[4], s)[0] for p in parts], 1)
    out["err_y"] = round(((y.float() - y_each.float()).norm() / y_each.float().norm()).item(), 5)
    return out


def main() -> None:
    args = projection_args(modes="persistent")
    import torch
    import triton
    from fp8_gemm import LINEARS  # (name, in, out) of one Qwen2.5-7B layer

    modes = args.modes.split(",")
    fp8 = "fp8" in modes
    wide = "wide" in modes
    modes = [m for m in modes if m not in ("fp8", "wide")]
    ways = ["bare", "op", *dict.fromkeys(BARE[m] for m in modes), *modes] if modes else []
    print(torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    rows, rows8, tot, tot8 = {}, {}, {}, {}
    for name, k, m in LINEARS:
        if not modes:
            break
        rows[name] = row = projection(args.tokens, k, m, args.rank, args.iters, modes)
        print(
            f"{name:<6} "
            + " ".join(f"{w} {row[w]:.3f}" for w in ways)
            + f"  (ms fwd+bwd; cuBLAS {row['tflops_bare']:.0f} TFLOP/s)  kernels "
            + " ".join(
                f"{k[:-5]} {v[0]:.3f}" + (f" {v[1][6:]}" if len(v[1]) > 6 else "")
                for k, v in row.items()
                if k.endswith("_best")
            )
            + "  err y, dx: "
            + " ".join(f"{m} {row['err_' + m]}" for m in modes)
        )
    if modes:
        tot = layer_totals(rows, ways)
    for name, k, m in LINEARS if fp8 else ():
        rows8[name] = row = projection_fp8(args.tokens, k, m, args.rank, args.iters)
        print(
            f"{name:<6} "
            + " ".join(f"{w} {row[w]:.3f}" for w in FP8_WAYS)
            + "  (ms x·Wᵀ + dy·W)  kernels "
            + " ".join(f"{k[:-5]} {v[0]:.3f} {v[1]}" for k, v in row.items() if k.endswith("_best"))
            + f"  err y, dx: {row['err_fwd_fp8triton']} {row['err_bwd_fp8triton']}"
        )
    if fp8:
        tot8 = layer_totals(rows8, FP8_WAYS, "fp8 layer")
    groups = {}
    for name, k, outs in GROUPS if wide else ():
        groups[name] = row = group(args.tokens, k, outs, args.rank, args.iters)
        print(
            f"{name:<8} each {row['each']:.3f} one {row['one']:.3f} (ms fwd+bwd) err y {row['err_y']}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"rows": rows, "layer": tot, "fp8": rows8, "fp8_layer": tot8, "groups": groups},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
