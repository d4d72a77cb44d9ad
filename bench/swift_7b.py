"""The 7B LoRA benchmark through tunedeck's swift backend (GPU machine, ms-swift installed).

Same model and batch as bench/trainer_bench.sh: Qwen2.5-7B architecture with random bf16
weights, LoRA r=8 all-linear (ms-swift's default dropout 0.05), SDPA, batch 4 x 2048 tokens, no
gradient checkpointing. The model folder is built here (random init, saved with
save_pretrained) with the demo's BPE tokenizer: the tokenizer only has to produce ids below the
vocabulary size; the embedding and head keep Qwen2.5's 152,064 rows, which is what costs time.

    python3 bench/swift_7b.py OUTDIR [--gpus 1] [--steps 20]

Runs `tunedeck launch SPEC --wait` and prints tokens/s/GPU from ms-swift's own step timings
(`train_speed(s/it)` in logging.jsonl, as ingested into the run's metrics), skipping warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()  # tunedeck from this checkout unless installed
SEQ, BATCH = 2048, 4


# Qwen2.5 shapes a bench can build (random weights): the 7B of the speed table, the 1.5B that
# full fine-tuning fits on one GPU with fp32 master weights
SHAPES = {
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


def make_model(out: Path, size: str = "7b") -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tunedeck.core.demo import ensure_tiny_model, load_tokenizer

    model_dir = out / ("qwen2.5-7b-random" if size == "7b" else f"qwen2.5-{size}-random")
    if (model_dir / "config.json").exists():
        return model_dir
    cfg = Qwen2Config(
        **SHAPES[size], max_position_embeddings=32768, rope_theta=1e6, torch_dtype="bfloat16"
    )
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    tiny = ensure_tiny_model(REPO / "presets" / "data" / "demo_chat.jsonl", out / "cache")
    load_tokenizer(tiny).save_pretrained(model_dir)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (tiny / name).exists() and not (model_dir / name).exists():
            (model_dir / name).write_bytes((tiny / name).read_bytes())
    del model
    torch.cuda.empty_cache()
    print(f"model folder built in {time.time() - t0:.0f} s", flush=True)
    return model_dir


def make_data(out: Path, model_dir: Path, n: int) -> Path:
    """Chats whose assistant turn is long enough that every sample fills max_length."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    words = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 2][:500] or ["token"]
    rng = random.Random(0)
    path = out / "long_chat.jsonl"
    with path.open("w") as f:
        for _ in range(n):
            answer = " ".join(rng.choice(words) for _ in range(SEQ * 2))
            f.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": "Write a long answer."},
                            {"role": "assistant", "content": answer},
                        ]
                    }
                )
                + "\n"
            )
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model_dir = make_model(out)
    data = make_data(out, model_dir, BATCH * a.gpus * (a.steps + 2))
    spec = out / "swift-7b.toml"
    spec.write_text(f"""name = "swift-7b-lora-bench"
backend = "swift"
[model]
path = "{model_dir}"
dtype = "bfloat16"
attn_impl = "sdpa"
[data]
path = "{data}"
max_length = {SEQ}
truncation = "right"
[method]
type = "lora"
lora_rank = 8
lora_alpha = 32
target_modules = ["all-linear"]
[train]
max_steps = {a.steps}
per_device_batch_size = {BATCH}
learning_rate = 1e-4
save_steps = 0
[cluster]
device = "cuda"
nproc_per_node = {a.gpus}
[swift]
extra_args = ["--model_type", "qwen2", "--template", "qwen", "--check_model", "false",
              "--report_to", "none", "--save_strategy", "no"]
""")
    env = dict(
        os.environ,
        TUNEDECK_HOME=str(out / "home"),
        TUNEDECK_CACHE=str(out / "cache"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        MODELSCOPE_CACHE=str(out / "ms"),
        HF_HOME=str(out / "hf"),
    )
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.tui", "launch", str(spec), "--wait", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n")
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    recs = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tunedeck.tui", "metrics", run_id, "--json"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        or "[]"
    )
    # ms-swift's train_speed(s/it) is elapsed-since-start / steps, so the elapsed time at step k
    # is k * speed_k and the steady step time is (E_last - E_warmup) / (last - warmup)
    speed = {r["step"]: r["step_s"] for r in recs if r.get("step_s")}
    last = max(speed, default=0)
    result = {
        "gpus": a.gpus,
        "exit_code": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "steps": len(recs),
        "loss_first": recs[0].get("loss") if recs else None,
        "loss_last": recs[-1].get("loss") if recs else None,
    }
    if last > a.warmup and a.warmup in speed:
        s_it = (last * speed[last] - a.warmup * speed[a.warmup]) / (last - a.warmup)
        result.update(
            steady_s_per_it=round(s_it, 4),
            tokens_per_s_per_gpu=round(BATCH * SEQ / s_it),
            swift_train_speed_last=speed[last],
        )
    print(json.dumps(result))
    (out / "swift_7b.json").write_text(json.dumps(result, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
