"""Unsloth on the anchor's shape: Qwen2.5-7B architecture (a random-weight folder, as
bench/swift_7b.py builds it), LoRA r=8 all-linear, dropout 0, bf16, batch 4 x 2048 random
tokens, no gradient checkpointing; 3 warm-up + 8 timed steps, the anchor's loop and FLOP count.

    python3 bench/unsloth_bench.py --model DIR --out DIR

Unsloth must be importable (its wheels carried; it is imported before transformers, as it
asks). Prints one JSON line with the anchor's keys (tokens_per_s_per_gpu, peak_mem_gib, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--bs", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    t0 = time.time()
    import unsloth  # noqa: F401  (patches transformers; must come first)
    from unsloth import FastLanguageModel
    import torch

    print(
        f"unsloth {getattr(unsloth, '__version__', '?')} imported in {time.time() - t0:.0f} s",
        flush=True,
    )
    model, _tok = FastLanguageModel.from_pretrained(
        a.model,
        max_seq_length=a.seq,
        dtype=torch.bfloat16,
        load_in_4bit=False,
        load_in_8bit=False,
        full_finetuning=False,
    )
    n_params = sum(p.numel() for p in model.parameters())
    model = FastLanguageModel.get_peft_model(
        model,
        r=a.rank,
        lora_alpha=4 * a.rank,
        lora_dropout=0.0,
        bias="none",
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        use_gradient_checkpointing=False,
    )
    FastLanguageModel.for_training(model)
    cfg = model.config
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, cfg.vocab_size, (a.bs, a.seq), generator=g).cuda(non_blocking=True)
        torch.cuda.synchronize()
        ts = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - ts)
        print(f"step {step} loss {loss.item():.4f} {time.perf_counter() - ts:.3f} s", flush=True)
    step_s = sorted(times)[len(times) // 2]
    tok_s = a.bs * a.seq / step_s
    L, h = cfg.num_hidden_layers, cfg.hidden_size
    flops_tok = 4 * n_params + 3 * (4 * L * a.seq * h * 2 // 2)  # the anchor's count
    res = dict(
        world=1,
        size="7b",
        params=n_params,
        seq=a.seq,
        bs=a.bs,
        median_step_s=round(step_s, 4),
        tokens_per_s_per_gpu=round(tok_s),
        tflops_per_gpu=round(tok_s * flops_tok / 1e12, 1),
        peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1),
        peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 1),
        unsloth=True,
    )
    print(json.dumps(res), flush=True)
    with open(os.path.join(a.out, "unsloth.json"), "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
