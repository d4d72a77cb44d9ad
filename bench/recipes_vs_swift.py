"""QLoRA and full fine-tuning: the built-in trainer against ms-swift on the same recipe (GPU).

Each recipe is one model, one dataset and one set of hyperparameters, written once and
launched twice through `tunedeck launch --wait`: `backend = "builtin"` and `backend =
"swift"`. Keys a user would tune (method, LoRA rank/alpha/dropout/targets, batch, length,
learning rate, no gradient checkpointing) are set in the spec, so both backends get them;
everything else is each tool's own default (compile on for the built-in trainer, off for
ms-swift; ms-swift keeps a full fine-tune's weights in bf16, the built-in trainer keeps fp32
master weights under bf16 autocast).

    python3 bench/recipes_vs_swift.py OUTDIR [--recipes qlora-7b,full-1.5b]
        [--backends builtin,swift] [--steps 16] [--warmup 5]
    (a recipe written RECIPE:BACKEND runs on that backend only)

Prints one JSON line per run and a table: tokens/s (steady, from `tunedeck metrics`), the GPU's
peak memory as NVML saw it (sampled every 50 ms, what nvidia-smi shows), the trainer's own
memory figure, and `tunedeck estimate`'s per-GPU figure for the same spec with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()  # tunedeck from this checkout unless installed
import swift_7b  # noqa: E402  (the model folder and the chats that fill max_length)

SEQ, BATCH = swift_7b.SEQ, swift_7b.BATCH
LORA = {"lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["all-linear"]}
RECIPES = {  # name: (model shape, method keys, more [train] keys)
    "qlora-7b": ("7b", {"type": "qlora", "quant_bits": 4, **LORA}, {}),
    "lora-7b": ("7b", {"type": "lora", **LORA}, {}),
    "full-1.5b": ("1.5b", {"type": "full"}, {}),
    # the built-in trainer without compile: what compile adds to a full fine-tune's memory
    "full-1.5b-eager": ("1.5b", {"type": "full"}, {"compile": False}),
    "qlora-7b-eager": ("7b", {"type": "qlora", "quant_bits": 4, **LORA}, {"compile": False}),
    # the built-in default (no dropout): 4-bit layers fused (core/train/qlora_fused.py), and
    # the same run through peft's own 4-bit layers
    "qlora-7b-nodrop": ("7b", {"type": "qlora", "quant_bits": 4, **LORA, "lora_dropout": 0.0}, {}),
}
# the QLoRA recipes through peft's 4-bit layers (RECIPE_ENV; the fused ones are the default)
RECIPES["qlora-7b-nodrop-peft"] = RECIPES["qlora-7b-nodrop"]
RECIPES["qlora-7b-peft"] = RECIPES["qlora-7b"]
RECIPE_ENV = {
    "qlora-7b-nodrop-peft": {"TUNEDECK_FUSED_LORA": "0"},
    "qlora-7b-peft": {"TUNEDECK_FUSED_LORA": "0"},
}
SWIFT_PASS = [
    "--model_type",
    "qwen2",
    "--template",
    "qwen",
    "--check_model",
    "false",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
]


def toml_value(v) -> str:
    return json.dumps(v)  # strings, numbers and lists of strings read the same in TOML


def write_spec(
    path: Path,
    backend: str,
    model_dir: Path,
    data: Path,
    method: dict,
    steps: int,
    train: dict | None = None,
) -> Path:
    lr = 1e-5 if method["type"] == "full" else 1e-4
    lines = [
        f'name = "{path.stem}"',
        f'backend = "{backend}"',
        "[model]",
        f"path = {toml_value(str(model_dir))}",
        'dtype = "bfloat16"',
        'attn_impl = "sdpa"',
        "[data]",
        f"path = {toml_value(str(data))}",
        f"max_length = {SEQ}",
        'truncation = "right"',
        "num_workers = 2",
        "[method]",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in method.items()]
    lines += [
        "[train]",
        f"max_steps = {steps}",
        f"per_device_batch_size = {BATCH}",
        # written although 1 is tunedeck's default: ms-swift's own default accumulates
        # ceil(16 / batch / GPUs) micro-batches, 4 here
        "grad_accum = 1",
        f"learning_rate = {lr}",
        "warmup_steps = 2",
        "save_steps = 0",
        "gradient_checkpointing = false",
    ]
    lines += [
        f"{k} = {str(v).lower() if isinstance(v, bool) else toml_value(v)}"
        for k, v in (train or {}).items()
    ]
    lines += ["[cluster]", 'device = "cuda"', "nproc_per_node = 1"]
    if backend == "swift":
        lines += ["[swift]", f"extra_args = {toml_value(SWIFT_PASS)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


class NvmlPeak:
    """Peak memory used on GPU 0 while a run goes (NVML, every 50 ms)."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.peak, self._stop = 0, threading.Event()
        self.base = self.nv.nvmlDeviceGetMemoryInfo(self.h).used
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.nv.nvmlDeviceGetMemoryInfo(self.h).used)

    def stop(self) -> float:
        self._stop.set()
        self.t.join()
        return round((self.peak - self.base) / 2**30, 2)


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.tui", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )


def one(out: Path, recipe: str, backend: str, a, env: dict) -> dict:
    size, method, train = RECIPES[recipe]
    model_dir = swift_7b.make_model(out.parent / size, size)  # one folder per shape
    data = out / "long_chat.jsonl"
    if not data.exists():
        swift_7b.make_data(out, model_dir, BATCH * (a.steps + 4))
    spec = write_spec(
        out / f"{recipe}-{backend}.toml", backend, model_dir, data, method, a.steps, train
    )
    est = cli(env, "estimate", str(spec), "--json", "--gpus", "1")
    estimate = json.loads(est.stdout) if est.returncode == 0 else {"error": est.stderr[-300:]}
    print(f"$ tunedeck launch {spec.name} --wait --json", flush=True)
    t0 = time.time()
    peak = NvmlPeak()
    proc = cli(env, "launch", str(spec), "--wait", "--json", "--no-preflight")
    nvml_peak = peak.stop()
    print(proc.stdout[-1500:], proc.stderr[-2500:], sep="\n", flush=True)
    res = {
        "recipe": recipe,
        "backend": backend,
        "exit_code": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "nvml_peak_gib": nvml_peak,
        "est_gib": estimate.get("per_gpu_gib"),
        "est_breakdown": estimate.get("breakdown"),
        "est_error": estimate.get("error"),
    }
    try:
        run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    except (IndexError, ValueError, KeyError):
        return res
    recs = json.loads(cli(env, "metrics", run_id, "--json").stdout or "[]")
    res.update(
        run_id=run_id,
        steps=len(recs),
        loss_first=recs[0].get("loss") if recs else None,
        loss_last=recs[-1].get("loss") if recs else None,
        trainer_mem_gib=max((r.get("mem_gib") or 0 for r in recs), default=None),
    )
    steady = [r for r in recs if r["step"] > a.warmup]
    if backend == "builtin":
        tps = [r["tokens_per_s"] for r in steady if r.get("tokens_per_s")]
        res["tokens_per_s"] = round(statistics.median(tps)) if tps else None
    else:
        # ms-swift's train_speed(s/it) is elapsed / steps: steady s/it from two points
        speed = {r["step"]: r["step_s"] for r in recs if r.get("step_s")}
        last = max(speed, default=0)
        if last > a.warmup and a.warmup in speed:
            s_it = (last * speed[last] - a.warmup * speed[a.warmup]) / (last - a.warmup)
            res.update(steady_s_per_it=round(s_it, 4), tokens_per_s=round(BATCH * SEQ / s_it))
    if res.get("tokens_per_s") is None and steady:  # no speed column: wall time per step
        ts = [r["time"] for r in steady if r.get("time")]
        if len(ts) > 1:
            res["tokens_per_s"] = round(BATCH * SEQ * (len(ts) - 1) / (ts[-1] - ts[0]))
    run_dir = out / "home" / "runs" / run_id
    log = run_dir / "logs" / "rank0.log"
    if proc.returncode != 0 and log.exists():
        res["log_tail"] = log.read_text(errors="replace")[-1500:]
    return res


def table(rows: list[dict]) -> str:
    lines = [
        "| recipe | backend | tokens/s | NVML peak GiB | trainer mem GiB | estimate GiB | "
        "estimate vs NVML | loss first → last |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        err = (
            f"{(r['est_gib'] - r['nvml_peak_gib']) / r['nvml_peak_gib']:+.0%}"
            if r.get("est_gib") and r.get("nvml_peak_gib")
            else "—"
        )
        lines.append(
            f"| {r['recipe']} | {r['backend']} | {r.get('tokens_per_s') or '—'} | "
            f"{r.get('nvml_peak_gib')} | {r.get('trainer_mem_gib') or '—'} | "
            f"{r.get('est_gib') or '—'} | {err} | "
            f"{r.get('loss_first')} → {r.get('loss_last')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--recipes", default="qlora-7b,full-1.5b")
    ap.add_argument("--backends", default="builtin,swift")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    out = Path(a.out).resolve()
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
    rows = []
    for item in a.recipes.split(","):  # RECIPE or RECIPE:BACKEND
        recipe, _, only = item.partition(":")
        sub = out / recipe
        sub.mkdir(parents=True, exist_ok=True)
        for backend in [only] if only else a.backends.split(","):
            env_r = dict(env, TUNEDECK_HOME=str(sub / "home"), **RECIPE_ENV.get(recipe, {}))
            if env.get("TUNEDECK_MEM_TRACE"):  # core/train/memtrace.py, one folder a run
                env_r["TUNEDECK_MEM_TRACE"] = str(
                    Path(env["TUNEDECK_MEM_TRACE"]) / f"{recipe}-{backend}"
                )
            r = one(sub, recipe, backend, a, env_r)
            print(json.dumps({k: v for k, v in r.items() if k != "est_breakdown"}), flush=True)
            rows.append(r)
            (out / "recipes.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    (out / "recipes.md").write_text(table(rows) + "\n")
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
