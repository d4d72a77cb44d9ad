"""One compiled 7B decoder layer of the built-in trainer, forward and backward, per way its
LoRA linears run (TUNEDECK_LORA_EPILOGUE): GPU time, peak memory, and each run's LoRA gradients
against the first's. Where triton-swiglu (core/train/swiglu_triton.py) is checked at the
preset's shapes before a trainer run measures it.

    python3 bench/swiglu_layer.py [--epilogues triton,triton-wide-mlp,triton-swiglu] [--json OUT]

Each epilogue runs in a process of its own (a kernel the compiler cannot build must not take
the others with it); the gradients travel through a temp file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()
from layer_shape import SHAPE, add_shape_args, qwen2_config  # noqa: E402


def one(a, epilogue: str, grads_out: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunedeck.core.train.fastpath import lean_saves
    from tunedeck.core.train.lora_fused import fuse_lora

    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    os.environ["TUNEDECK_LORA_EPILOGUE"] = epilogue
    lean_saves(True)
    # the interpreter's bf16 is not the GPU's: the CPU check runs in fp32
    dt = torch.bfloat16 if a.device == "cuda" else torch.float32
    cfg = qwen2_config(a)
    torch.manual_seed(0)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        with torch.no_grad():  # what a checkpoint's scale looks like, whatever the init did
            for name, p in model.named_parameters():
                p.normal_(0, 0.02) if p.dim() == 2 else p.fill_(1.0 if "norm" in name else 0.0)
    model = get_peft_model(
        model.to(dt),
        LoraConfig(
            r=a.rank, lora_alpha=2 * a.rank, target_modules="all-linear", init_lora_weights=False
        ),
    )
    fused = fuse_lora(model, torch.device(a.device))
    layer = model.base_model.model.model.layers[0]
    layer.compile()
    g = torch.Generator(device=a.device).manual_seed(1)
    x = torch.randn(
        a.batch, a.seq, a.hidden, device=a.device, dtype=dt, generator=g
    ).requires_grad_()
    dy = torch.randn(x.shape, device=a.device, dtype=dt, generator=g)
    pe = model.base_model.model.model.rotary_emb(x, torch.arange(a.seq, device=a.device)[None])
    params = {n: p for n, p in layer.named_parameters() if p.requires_grad}

    def step():
        for p in params.values():
            p.grad = None
        out = layer(x, position_embeddings=pe, attention_mask=None)
        (out[0] if isinstance(out, tuple) else out).backward(dy)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # compile, then warm
        step()
    sync()
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.iters):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.save({n: p.grad.float().cpu() for n, p in params.items()}, grads_out)
    kernels = []
    if a.profile and a.device == "cuda":  # one more step's kernels, the longest first
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        rows = [e for e in prof.key_averages() if e.device_time_total > 0]
        rows.sort(key=lambda e: -e.device_time_total)
        kernels = [(e.key[:70], round(e.device_time_total / 1e3, 3), e.count) for e in rows[:14]]
    times.sort()
    return {
        "epilogue": epilogue,
        "fused": fused,
        "swiglu_blocks": sum(bool(getattr(m, "_tunedeck_swiglu", False)) for m in layer.modules()),
        "ms_median": times[len(times) // 2],
        "ms_min": times[0],
        "kernels": kernels,
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epilogues", default="triton,triton-wide-mlp,triton-swiglu")
    add_shape_args(ap, hidden=3584, ffn=18944, heads=28, kv=4, rank=16, batch=4, seq=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="each epilogue's kernels, one step")
    ap.add_argument("--device", default="cuda")  # cpu: a check under TRITON_INTERPRET=1
    ap.add_argument("--one", help=argparse.SUPPRESS)  # EPILOGUE:GRADS_FILE, in the child
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.one:
        epilogue, out = a.one.split(":", 1)
        print(json.dumps(one(a, epilogue, out)))
        return 0
    import torch

    rows, first = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for ep in a.epilogues.split(","):
            out = str(Path(tmp) / f"{ep}.pt")
            shape = (*SHAPE, "iters", "device")
            args = [f"--{k}={getattr(a, k)}" for k in shape] + ["--profile"] * a.profile
            p = subprocess.run(
                [sys.executable, __file__, *args, "--one", f"{ep}:{out}"],
                capture_output=True,
                text=True,
            )
            if p.returncode:
                print(f"{ep}: failed\n{p.stderr[-3000:]}")
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            grads = torch.load(out)
            if first is None:
                first = grads
            # each LoRA gradient against the first epilogue's: the worst relative difference
            row["grad_rel_max"] = max(
                ((grads[k] - first[k]).norm() / first[k].norm()).item() for k in first
            )
            rows.append(row)
            print(
                f"{ep:>16}: {row['ms_median']:7.2f} ms (min {row['ms_min']:.2f}) a layer fwd+bwd, "
                f"peak {row['peak_alloc_gib']:.2f} GiB, swiglu blocks {row['swiglu_blocks']}, "
                f"grads vs {rows[0]['epilogue']}: {row['grad_rel_max']:.2e}",
                flush=True,
            )
            for name, ms, n in row["kernels"]:
                print(f"      {ms:8.3f} ms {n:4d}x  {name}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
