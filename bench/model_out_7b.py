"""The 7B preset's trained model out, on the GPU machine: a LoRA checkpoint of the preset's
shape (rank, alpha, targets; random non-zero weights) on a Qwen2.5-7B-shaped folder of random
bf16 weights (bench/swift_7b.py), merged and exported with `export_model` (bf16), then a chat
answer from the checkpoint (`Chat`): time to first token and tokens/s, tuned and base.

    python3 bench/model_out_7b.py OUTDIR [--tokens 128]

Prints one JSON line (also OUTDIR/model_out_7b.json)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()
PRESET = REPO / "presets" / "builtin-7b-lora-h200.toml"


def make_run(out: Path, model_dir: Path, device: str) -> Path:
    """A run folder holding the preset's spec and one complete adapter checkpoint."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunedeck.core.spec import load_spec

    spec = load_spec(PRESET)
    spec.model.path = str(model_dir)
    run_dir = out / "run-7b"
    ckpt = run_dir / "output" / "checkpoint-1"
    ckpt.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.toml").write_text(spec.to_toml())
    m = spec.method
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).to(device)
    targets = "all-linear" if m.target_modules == ["all-linear"] else m.target_modules
    peft = get_peft_model(
        base,
        LoraConfig(
            r=m.lora_rank, lora_alpha=m.lora_alpha, target_modules=targets, init_lora_weights=False
        ),
    )
    peft.save_pretrained(ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1, "loss": 1.0}))
    del peft, base
    torch.cuda.empty_cache()
    return run_dir


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import swift_7b
    import torch

    from tunedeck.core.api import Answer, Chat, export_model, pick_checkpoint

    model_dir = swift_7b.make_model(out)
    t0 = time.perf_counter()
    run_dir = make_run(out, model_dir, "cuda:0")
    adapter_s = time.perf_counter() - t0
    src = pick_checkpoint(run_dir, "last")
    t0 = time.perf_counter()
    merged = export_model(src, out / "merged", dtype="bf16", device="cuda:0", progress=print)
    export_s = time.perf_counter() - t0
    size_gb = sum(f.stat().st_size for f in merged.iterdir()) / 1e9
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    chat = Chat(src, device="auto")
    load_s = time.perf_counter() - t0
    prompt = "How do I find out why my data loader is slow?"
    res = {}
    for tuned in (True, False, True):  # the first answer warms the kernels; the third is timed
        ans = Answer()
        for _ in chat.stream(prompt, tuned, a.tokens, ans):
            pass
        res["tuned" if tuned else "base"] = {
            "tokens": ans.tokens,
            "ttft_s": round(ans.ttft_s or 0, 4),
            "tokens_per_s": round(ans.tokens_per_s or 0, 1),
        }
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "adapter_build_s": round(adapter_s, 1),
        "export_s": round(export_s, 1),
        "export_gb": round(size_gb, 2),
        "chat_load_s": round(load_s, 1),
        "chat_device": chat.device,
        "chat": res,
    }
    print(json.dumps(result))
    (out / "model_out_7b.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
