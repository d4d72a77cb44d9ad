"""How much a LoRA fine-tune's numbers move when the frozen base's products run in fp8, on
activations shaped like a pretrained model's, against bf16 and a float64 reference.

    python3 bench/fp8_study.py [--device cpu|cuda] [--tokens N] [--ffn F] [--json OUT]

One Qwen2.5-7B-wide MLP block (hidden 3584; the FFN width F, full 18944 on a GPU) with LoRA
r=16 on gate, up and down, written out by hand so that every product runs in the precision
under test (core/train/fp8_scaling.py): float64 (the reference), fp32, bf16, and fp8 under
each scheme (per-row, 1×128 tiles with 128×128 weight blocks, per-row with 8 outlier
channels in bf16). Inputs, after the norm that feeds the block:

  plain      N(0, 1) with per-channel scales spread log-normally (σ 0.5)
  channels   plain + 6 input channels ×20 on every token (LLM.int8(), Dettmers et al. 2022:
             systematic outlier features up to magnitude 20 from 6.7B parameters on)
  massive    channels + 2 tokens (the first and a delimiter) whose 2 massive channels are
             1,000× / 10,000× the median magnitude, at the block's input and at down's input
             (Sun et al. 2024, "Massive Activations in LLMs": >1,000× the median, up to
             100,000×, in two fixed dimensions of LLaMA2-7B at the starting and first
             delimiter tokens; they arise in an early MLP's down projection)

For each: the relative error of each layer's output, of the block's input gradient, and of
the LoRA gradients (and their cosine), against float64. On a GPU it also times one 7B
gate-sized product in bf16, fp8 per-row and fp8 1×128/128×128 blockwise (where this torch
offers it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()

from tunedeck.core.train.fp8_scaling import SCHEMES, bf16, product  # noqa: E402

HIDDEN, RANK, ALPHA = 3584, 16, 32


def inputs(kind: str, n: int, k: int, gen: torch.Generator, massive: float = 0.0):
    scales = torch.exp(0.5 * torch.randn(k, generator=gen, dtype=torch.float64))
    x = torch.randn(n, k, generator=gen, dtype=torch.float64) * scales
    if kind in ("channels", "massive"):
        x[:, torch.randperm(k, generator=gen)[:6]] *= 20.0
    mask = None
    if kind == "massive":
        med = x.abs().median()
        tokens, chans = torch.tensor([0, n // 3]), torch.randperm(k, generator=gen)[:2]
        x[tokens[:, None], chans] = massive * med
        mask = (tokens, massive)
    return x, mask


class Block:
    """gate/up/down with LoRA; `mode` None (float64), "fp32", "bf16" or a Scheme."""

    def __init__(self, k: int, f: int, gen: torch.Generator):
        def w(o, i):
            return torch.randn(o, i, generator=gen, dtype=torch.float64) / i**0.5

        self.w = {"gate": w(f, k), "up": w(f, k), "down": w(k, f)}
        self.a = {n: w(RANK, m.shape[1]) for n, m in self.w.items()}
        self.b = {
            n: 0.02 * torch.randn(m.shape[0], RANK, generator=gen, dtype=torch.float64)
            for n, m in self.w.items()
        }
        self.s = ALPHA / RANK

    @staticmethod
    def mm(a, b, mode):  # a · bᵀ, outside the frozen products (the adapters: bf16 in training)
        if mode is None:
            return a @ b.t()
        if mode == "fp32":
            return (a.float() @ b.float().t()).double()
        return bf16((bf16(a).float() @ bf16(b).float().t()).double())

    @staticmethod
    def frozen(a, b, mode):
        if mode is None:
            return a @ b.t()
        if mode == "fp32":
            return (a.float() @ b.float().t()).double()
        return product(a, b, None if mode == "bf16" else mode)

    def rnd(self, t, mode):
        return bf16(t) if mode not in (None, "fp32") else t

    def lin(self, x, n, mode):
        u = self.mm(x, self.a[n], mode)
        return self.rnd(
            self.frozen(x, self.w[n], mode) + self.s * self.mm(u, self.b[n], mode), mode
        ), u

    def lin_back(self, x, u, dy, n, mode):
        g = self.s * self.mm(dy, self.b[n].t(), mode)  # (N, r)
        dx = self.frozen(dy, self.w[n].t().contiguous(), mode) + self.mm(g, self.a[n].t(), mode)
        da = self.mm(g.t().contiguous(), x.t().contiguous(), mode)
        db = self.s * self.mm(dy.t().contiguous(), u.t().contiguous(), mode)
        return self.rnd(dx, mode), da, db

    def run(self, x, mask, target, mode):
        x = self.rnd(x, mode)
        g, ug = self.lin(x, "gate", mode)
        up, uu = self.lin(x, "up", mode)
        m = torch.ones_like(g)
        if mask is not None:  # down's input carries the massive values at the same tokens
            m[mask[0][:, None], torch.tensor([0, 1], device=g.device)] = mask[1]
        act = F.silu(g)
        h = self.rnd(act * up * m, mode)
        y, ud = self.lin(h, "down", mode)
        dy = target
        dh, da_d, db_d = self.lin_back(h, ud, dy, "down", mode)
        dh = dh * m
        sig = torch.sigmoid(g)
        dg = self.rnd(dh * up * (sig * (1 + g * (1 - sig))), mode)
        du = self.rnd(dh * act, mode)
        dxg, da_g, db_g = self.lin_back(x, ug, dg, "gate", mode)
        dxu, da_u, db_u = self.lin_back(x, uu, du, "up", mode)
        return {
            "out": {"gate": g, "up": up, "down": y},
            "dx": dxg + dxu,
            "grads": {
                "gate.A": da_g,
                "gate.B": db_g,
                "up.A": da_u,
                "up.B": db_u,
                "down.A": da_d,
                "down.B": db_d,
            },
        }


def rel(a, b):
    return float((a - b).norm() / b.norm())


def compare(got, ref):
    grads = {
        n: {
            "rel": rel(g, ref["grads"][n]),
            "cos": float(F.cosine_similarity(g.flatten(), ref["grads"][n].flatten(), dim=0)),
        }
        for n, g in got["grads"].items()
    }
    return {
        "out_rel": {n: rel(o, ref["out"][n]) for n, o in got["out"].items()},
        "out_worst_row": {
            n: float(((o - ref["out"][n]).norm(dim=1) / ref["out"][n].norm(dim=1)).max())
            for n, o in got["out"].items()
        },
        "dx_rel": rel(got["dx"], ref["dx"]),
        "grad_rel_max": max(g["rel"] for g in grads.values()),
        "grad_cos_min": min(g["cos"] for g in grads.values()),
        "grads": grads,
    }


def study(device: str, tokens: int, ffn: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    blk = Block(HIDDEN, ffn, gen)
    modes: dict[str, object] = {"fp32": "fp32", "bf16": "bf16"}
    modes.update({s.name: s for s in SCHEMES})
    out = {}
    for kind, massive in (("plain", 0), ("channels", 0), ("massive", 1e3), ("massive", 1e4)):
        label = kind if not massive else f"massive {massive:,.0f}x"
        x, mask = inputs(kind, tokens, HIDDEN, gen, massive)
        target = torch.randn(tokens, HIDDEN, generator=gen, dtype=torch.float64) / tokens
        to = lambda t: t.to(device)  # noqa: E731
        for k in ("w", "a", "b"):
            setattr(blk, k, {n: to(t) for n, t in getattr(blk, k).items()})
        x, target = to(x), to(target)
        if mask is not None:
            mask = (mask[0].to(device), mask[1])
        ref = blk.run(x, mask, target, None)
        out[label] = {name: compare(blk.run(x, mask, target, m), ref) for name, m in modes.items()}
        row = out[label]
        print(
            f"\n{label}: relative error against float64 (output gate/up/down | worst row | dx | LoRA grads max | min cos)"
        )
        for name, r in row.items():
            o = r["out_rel"]
            print(
                f"  {name:52s} {o['gate']:.2e}/{o['up']:.2e}/{o['down']:.2e} | "
                f"{max(r['out_worst_row'].values()):.2e} | {r['dx_rel']:.2e} | "
                f"{r['grad_rel_max']:.2e} | {r['grad_cos_min']:.6f}",
                flush=True,
            )
    return out


def gemm_speed(tokens: int = 8192, k: int = HIDDEN, n: int = 18944) -> dict:
    """One gate-sized product on the GPU: bf16, fp8 per-row, fp8 blockwise (if offered)."""
    from tunedeck.core.train.lora_fused import quant_rows

    dev = "cuda"
    x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5

    def t(fn, reps=50):
        for _ in range(5):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        ms = s.elapsed_time(e) / reps
        return {"ms": round(ms, 4), "tflops": round(2 * tokens * k * n / ms / 1e9, 1)}

    res = {"bf16": t(lambda: x @ w.t())}
    x8, sx = quant_rows(x)
    w8, sw = quant_rows(w)
    res["fp8 per-row"] = t(
        lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)
    )
    # 1×128 tiles of x, 128×128 blocks of w: scale_a (tokens, k/128) M-major, scale_b (n/128, k/128)
    xs = x.float().reshape(tokens, k // 128, 128).abs().amax(-1).clamp(min=1e-12) / 448
    xq = (
        (x.float().reshape(tokens, k // 128, 128) / xs[..., None])
        .reshape(tokens, k)
        .to(torch.float8_e4m3fn)
    )
    ws = w.float().reshape(n // 128, 128, k // 128, 128).abs().amax((1, 3)).clamp(min=1e-12) / 448
    wq = (
        (w.float().reshape(n // 128, 128, k // 128, 128) / ws[:, None, :, None])
        .reshape(n, k)
        .to(torch.float8_e4m3fn)
    )
    sa = xs.t().contiguous().t()  # outer-dim-major, as cuBLAS's blockwise mode wants
    tries = {
        "_scaled_mm(sa, sb)": lambda: torch._scaled_mm(
            xq, wq.t(), scale_a=sa, scale_b=ws.t(), out_dtype=torch.bfloat16
        ),
        "_scaled_mm(sa, sb.T)": lambda: torch._scaled_mm(
            xq, wq.t(), scale_a=sa, scale_b=ws, out_dtype=torch.bfloat16
        ),
    }
    ref = x.float() @ w.float().t()
    for name, fn in tries.items():
        try:
            y = fn()
            err = float((y.float() - ref).norm() / ref.norm())
            res["fp8 1x128/128x128 " + name] = {**t(fn), "rel_err": round(err, 5)}
            break
        except Exception as e:  # noqa: BLE001 - record which form this torch refuses
            res["fp8 1x128/128x128 " + name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)
    res["fp8 per-row"]["rel_err"] = round(float((y.float() - ref).norm() / ref.norm()), 5)
    res["bf16"]["rel_err"] = round(float(((x @ w.t()).float() - ref).norm() / ref.norm()), 5)
    for name, r in res.items():
        print(f"  gemm {tokens}x{k}x{n} {name}: {r}", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--ffn", type=int, default=4736, help="FFN width (a multiple of 128)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    res = {
        "device": a.device,
        "tokens": a.tokens,
        "ffn": a.ffn,
        "study": study(a.device, a.tokens, a.ffn),
    }
    if a.device == "cuda":
        res["gemm"] = gemm_speed()
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
