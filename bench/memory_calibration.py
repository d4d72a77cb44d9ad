"""Measure peak GPU memory of real training steps and compare with tunedeck.core.estimate.

    python bench/memory_calibration.py OUTDIR          # GPU machine (2 GPUs for the DDP/FSDP2 rows)
    python bench/memory_calibration.py OUTDIR --tiny   # CPU check of the whole pipeline
    python bench/memory_calibration.py OUTDIR --only 7b-lora-gc-1gpu,7b-full-fsdp2-gc

Each configuration builds a Qwen2.5-shaped model from its config (random weights, no download),
runs 3 optimizer steps the way HF Trainer / ms-swift do (bf16 weights, bf16 autocast, AdamW with
states in the params' dtype, HF's loss from labels; FSDP2 full fine-tuning keeps fp32 sharded
masters with bf16 compute) and records torch.cuda.max_memory_reserved. 1-GPU configurations run
in one process, 2-GPU ones in one torchrun of 2 ranks. Writes results.jsonl and table.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from tunedeck.core.estimate import QWEN25, MemoryInputs, arch_from_config, estimate_memory  # noqa: E402

TINY = dict(
    model_type="qwen2",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    tie_word_embeddings=True,
)
STEPS = 3
# name, size, method, strategy, gpus, gc, micro batch, seq, lora_dropout
CONFIGS = [
    ("0.5b-lora-1gpu", "0.5b", "lora", "ddp", 1, False, 4, 2048, 0.0),
    ("0.5b-full-gc-1gpu", "0.5b", "full", "ddp", 1, True, 4, 2048, 0.0),
    ("1.5b-full-1gpu", "1.5b", "full", "ddp", 1, False, 2, 2048, 0.0),
    ("7b-lora-drop-1gpu", "7b", "lora", "ddp", 1, False, 4, 2048, 0.05),
    ("7b-lora-gc-1gpu", "7b", "lora", "ddp", 1, True, 4, 2048, 0.0),
    ("0.5b-full-ddp2", "0.5b", "full", "ddp", 2, False, 4, 2048, 0.0),
    ("1.5b-lora-ddp2", "1.5b", "lora", "ddp", 2, False, 4, 2048, 0.0),
    ("1.5b-full-fsdp2-gc", "1.5b", "full", "fsdp2", 2, True, 4, 2048, 0.0),
    ("7b-full-fsdp2-gc", "7b", "full", "fsdp2", 2, True, 1, 2048, 0.0),
]


def estimate_for(cfg: dict, c: tuple) -> dict:
    name, _, method, strategy, gpus, gc, mb, seq, drop = c
    cuda = os.environ.get("CALIB_TINY") != "1"
    e = estimate_memory(
        MemoryInputs(
            arch_from_config(cfg),
            method=method,
            lora_rank=8,
            lora_dropout=drop,
            micro_batch=mb,
            seq_len=seq,
            strategy=strategy,
            world_size=gpus,
            gradient_checkpointing=gc,
            device="cuda" if cuda else "cpu",
            # run_one builds every model in fp32 on the GPU, then casts (or shards) it: the freed
            # fp32 blocks are still reserved when the peak counters are reset
            materialize_bytes=4,
        )
    )
    return {
        "est_reserved_gib": round(e.reserved_gib, 2),
        "est_allocated_gib": round(e.allocated_gib, 2),
        "est_per_gpu_gib": round(e.per_gpu_gib, 2),
    }


def run_one(c: tuple, cfg: dict, device, rank: int, world: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    name, _, method, strategy, gpus, gc, mb, seq, drop = c
    cuda = device.type == "cuda"
    fsdp_full = strategy == "fsdp2" and method == "full"
    dtype = torch.float32 if (fsdp_full or not cuda) else torch.bfloat16
    torch.manual_seed(0)
    conf = Qwen2Config(
        **{k: v for k, v in cfg.items() if k != "model_type"},
        max_position_embeddings=max(seq, 4096),
        use_cache=False,
    )
    conf._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2ForCausalLM(conf).to(dtype)
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        if gc:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                task_type="CAUSAL_LM",
                r=8,
                lora_alpha=32,
                lora_dropout=drop,
                target_modules="all-linear",
            ),
        )
    if strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if cuda
            else MixedPrecisionPolicy()
        )
        for layer in (
            model.model.layers if method == "full" else model.base_model.model.model.layers
        ):
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        wrapped = model
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, device_ids=[device.index] if cuda else None)
    else:
        wrapped = model
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, cfg["vocab_size"], (mb, seq), device=device)
    start = {}
    if cuda:
        torch.cuda.synchronize()
        # what building the model left reserved (the peak counters start from it)
        start = {
            "start_reserved_gib": round(torch.cuda.memory_reserved(device) / 2**30, 2),
            "start_allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 2),
        }
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(STEPS):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    out = {
        "name": name,
        "loss": float(loss.detach()),
        "step_s": round((time.time() - t0) / STEPS, 3),
        **start,
    }
    if cuda:
        torch.cuda.synchronize()
        out["measured_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 2)
        out["measured_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    del wrapped, model, opt, loss, ids
    if cuda:
        torch.cuda.empty_cache()
    return out


def selected(only: str) -> list[tuple]:
    """CONFIGS filtered by a comma-separated list of names ("" = all)."""
    if not only:
        return list(CONFIGS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {c[0] for c in CONFIGS}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(
            f"--only: unknown configuration {', '.join(bad)}; known: {', '.join(sorted(known))}"
        )
    return [c for c in CONFIGS if c[0] in names]


def worker(group: str, out_dir: Path, only: str = "") -> None:
    import torch

    tiny = os.environ.get("CALIB_TINY") == "1"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available() and not tiny
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo")
    configs = [c for c in selected(only) if (c[4] == 1) == (group == "1gpu")]
    for c in configs:
        cfg = TINY if tiny else QWEN25[c[1]]
        c = c if not tiny else (*c[:6], 2, 64, c[8])
        try:
            res = run_one(c, cfg, device, rank, world)
        except Exception as e:  # noqa: BLE001 - record the failure, go on with the rest
            res = {"name": c[0], "error": f"{type(e).__name__}: {e}"[:500]}
            if cuda:
                torch.cuda.empty_cache()
        res.update(estimate_for(cfg, c))
        res.update(
            {
                "method": c[2],
                "strategy": c[3],
                "gpus": c[4],
                "gc": c[5],
                "micro_batch": c[6],
                "seq": c[7],
                "lora_dropout": c[8],
                "size": c[1],
            }
        )
        if rank == 0:
            with open(out_dir / "results.jsonl", "a") as f:
                f.write(json.dumps(res) + "\n")
            print(json.dumps(res), flush=True)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def table(rows: list[dict]) -> str:
    lines = [
        "| config | est reserved | measured reserved | error % | est allocated | "
        "measured allocated | reserved at start |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.get("measured_reserved_gib")
        err = f"{(r['est_reserved_gib'] - m) / m * 100:+.1f}" if m else "–"
        lines.append(
            f"| {r['name']} | {r['est_reserved_gib']} | "
            f"{m if m is not None else r.get('error', 'n/a (CPU)')} | {err} | "
            f"{r['est_allocated_gib']} | {r.get('measured_allocated_gib', '–')} | "
            f"{r.get('start_reserved_gib', '–')} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        worker(argv[1], Path(argv[2]), argv[3] if len(argv) > 3 else "")
        return 0
    tiny = "--tiny" in argv
    args = [a for a in argv if a != "--tiny"]
    only = ""
    if "--only" in args:
        i = args.index("--only")
        if i + 1 >= len(args):
            print("--only needs NAME[,NAME]", file=sys.stderr)
            return 2
        only = args[i + 1]
        del args[i : i + 2]
    if not args:
        print(__doc__)
        return 2
    try:
        chosen = selected(only)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").unlink(missing_ok=True)
    env = dict(
        os.environ,
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        OMP_NUM_THREADS="1",
        CALIB_TINY="1" if tiny else "0",
    )
    me = str(Path(__file__).resolve())
    t0 = time.time()
    env1 = dict(env, CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    if any(c[4] == 1 for c in chosen):
        subprocess.run(
            [sys.executable, me, "--worker", "1gpu", str(out), only],
            env=env1,
            check=False,
            timeout=400,
        )
    if any(c[4] == 2 for c in chosen):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                me,
                "--worker",
                "2gpu",
                str(out),
                only,
            ],
            env=env,
            check=False,
            timeout=400,
        )
    res = out / "results.jsonl"
    rows = [json.loads(ln) for ln in res.read_text().splitlines() if ln] if res.exists() else []
    md = table(rows)
    (out / "table.md").write_text(md + f"\n\ntotal {time.time() - t0:.0f}s\n")
    print(md)
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
