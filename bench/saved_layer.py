"""What one compiled decoder layer of the built-in trainer saves for backward, by shape.

A Qwen2 layer of the given size with the trainer's fused LoRA linears (all-linear), compiled by
Inductor as the trainer compiles it, run once under bf16 autocast; every tensor saved for
backward is counted once per storage through saved-tensor hooks (weights and the shared RoPE
tables left out). Both partitions: torch's default and tunedeck's lean one
(core/train/fastpath.lean_saves). Where the estimator's count of the lean layer comes from.

    python3 bench/saved_layer.py --device cuda --hidden 3584 --ffn 18944 --heads 28 --kv 4 \
        --batch 4 --seq 2048 [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()
from layer_shape import add_shape_args, qwen2_config  # noqa: E402


def saved(device: str, a, lean: bool) -> dict:
    import torch
    import torch._dynamo
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunedeck.core.train.fastpath import lean_saves
    from tunedeck.core.train.lora_fused import fuse_lora

    torch._dynamo.reset()
    lean_saves(lean)
    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    cfg = qwen2_config(a)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(torch.bfloat16)
    model = get_peft_model(
        model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, target_modules="all-linear")
    )
    assert fuse_lora(model, torch.device(device)) == 7
    layer = model.base_model.model.model.layers[0]
    layer.compile()
    x = torch.randn(
        a.batch, a.seq, a.hidden, device=device, dtype=torch.bfloat16, requires_grad=True
    )
    pe = model.base_model.model.model.rotary_emb(x, torch.arange(a.seq, device=device)[None])
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in pe}
    seen: dict[int, tuple] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip and not (
            t.dim() == 2 and a.rank in t.shape and t.shape[0] != a.batch * a.seq
        ):
            seen[st.data_ptr()] = (st.nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."))
        return t

    for _ in range(2):  # the second pass: compiled, nothing left to trace
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(device, dtype=torch.bfloat16):
                out = layer(x, position_embeddings=pe, attention_mask=None)
        (out[0] if isinstance(out, tuple) else out).float().pow(2).mean().backward()
    tokens = a.batch * a.seq
    by = collections.Counter()
    for nb, shape, dt in seen.values():
        by[f"{list(shape)} {dt}"] += nb
    return {
        "bytes_per_token": sum(v[0] for v in seen.values()) / tokens,
        "by_shape": {k: round(v / tokens, 1) for k, v in by.most_common()},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    add_shape_args(ap, hidden=256, ffn=1344, heads=8, kv=2, rank=16, batch=2, seq=256)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"default": saved(a.device, a, False), "lean": saved(a.device, a, True)}
    for k, v in res.items():
        print(f"{k}: {v['bytes_per_token']:.0f} bytes a token")
        for s, b in v["by_shape"].items():
            print(f"   {b:>9.1f}  {s}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
