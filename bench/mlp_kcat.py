"""One Qwen2.5-7B MLP block with LoRA, compiled as the trainer compiles its layers: the default
fused linears ("op") against the MLP's adapters as extra K columns ("kcat", core/train/lora_kcat.py).

The post-attention norm and the gated MLP (hidden 3,584, intermediate 18,944, r = 16 on gate, up
and down, bf16), forward and backward over --tokens tokens, torch.compile with the trainer's lean
saves; wall time of each step after a synchronize, median of --iters after warm-up; the loss and LoRA gradients of the two ways
compared. Same machine, same call: the A/B the trainer's step would show, without the rest of
the step.

    python3 bench/mlp_kcat.py [--tokens 8192] [--iters 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()
DEV = os.environ.get("MLP_KCAT_DEVICE", "cuda")  # cpu: a dry run


def sync() -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def block(way: str, tokens: int, iters: int) -> dict:
    import torch
    import torch._dynamo
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm

    from tunedeck.core.train.fastpath import lean_saves
    from tunedeck.core.train.lora_fused import fuse_lora

    os.environ["TUNEDECK_LORA_EPILOGUE"] = way
    torch._dynamo.reset()
    lean_saves(True)
    cfg = Qwen2Config(hidden_size=3584, intermediate_size=18944)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.mlp = Qwen2RMSNorm(3584), Qwen2MLP(cfg)

        def forward(self, h):
            return h + self.mlp(self.norm(h))

    torch.manual_seed(0)
    m = Block().to(DEV, torch.bfloat16)
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=["gate_proj", "up_proj", "down_proj"])
    m = get_peft_model(m, lcfg)
    for n, p in m.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    assert fuse_lora(m, torch.device(DEV)) == 3
    f = torch.compile(m.base_model.model)
    torch.manual_seed(1)
    h = torch.randn(tokens, 3584, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(h)

    def step():
        h.grad = None
        for p in m.parameters():
            p.grad = None
        f(h).backward(dy)

    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step()
    grads = {n: p.grad.float().clone() for n, p in m.named_parameters() if p.requires_grad}
    return {
        "ms": statistics.median(times),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if DEV == "cuda" else 0.0,
        "grads": grads,
        "dh": h.grad.float().clone(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import torch

    print(torch.__version__, torch.cuda.get_device_name() if DEV == "cuda" else DEV)
    res = {way: block(way, a.tokens, a.iters) for way in ("op", "kcat")}
    ref = res["op"]
    rows = {}
    for way, r in res.items():
        worst = max(((r["grads"][k] - g).norm() / g.norm()).item() for k, g in ref["grads"].items())
        dh = ((r["dh"] - ref["dh"]).norm() / ref["dh"].norm()).item()
        rows[way] = {"ms": r["ms"], "peak_gib": r["peak_gib"], "worst_lora_grad": worst, "dh": dh}
        print(
            f"{way:<5} {r['ms']:8.3f} ms fwd+bwd  peak {r['peak_gib']:.2f} GiB  "
            f"worst LoRA grad vs op {worst:.2e}  dh {dh:.2e}  "
            f"(x 28 layers x 4 micro-batches: {r['ms'] * 112:.0f} ms a step)"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
