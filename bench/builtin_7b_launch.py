"""The 7B preset through `tunedeck launch`, read back with `tunedeck metrics` (GPU machine).

presets/builtin-7b-lora-h200.toml (or `--preset`) as it is (compile on by default, its LoRA and
batch settings), with only what the machine needs set: a Qwen2.5-7B-shaped folder of random bf16
weights and chats that fill max_length (both from bench/swift_7b.py), a few steps, no saves.

    python3 bench/builtin_7b_launch.py OUTDIR [--steps 12] [--warmup 4] [--set KEY=VALUE]...
                                             [--name launch] [--preset PATH]

Prints the launch's output and one JSON line: tokens/s (median over steps after the warm-up,
from the metrics records), labelled tokens/s, peak memory, the compile phase from events.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()  # tunedeck from this checkout unless installed
PRESET = REPO / "presets" / "builtin-7b-lora-h200.toml"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument(
        "--model-root", help="where the random 7B folder is (or is built); default OUTDIR"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        dest="extra",
        help="one more spec override (e.g. method.fp8_base=true)",
    )
    ap.add_argument("--name", default="launch", help="the result file: OUTDIR/NAME.json")
    ap.add_argument("--preset", default=str(PRESET), help="a built-in preset of the 7B's shape")
    a = ap.parse_args()
    preset_path = Path(a.preset).resolve()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import swift_7b
    from tunedeck.core.spec import load_spec

    preset = load_spec(preset_path)
    per_step = preset.train.per_device_batch_size * preset.train.grad_accum
    model_dir = swift_7b.make_model(Path(a.model_root).resolve() if a.model_root else out)
    data = swift_7b.make_data(out, model_dir, per_step * (a.steps + 2))
    env = dict(
        os.environ,
        TUNEDECK_HOME=str(out / "home"),
        TUNEDECK_CACHE=str(out / "cache"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(out / "hf"),
    )
    sets = [
        f"model.path={model_dir}",
        f"data.path={data}",
        f"train.max_steps={a.steps}",
        "train.save_steps=0",
        "train.warmup_steps=2",
        "data.num_workers=2",
        *a.extra,
    ]
    argv = [sys.executable, "-m", "tunedeck.tui", "launch", str(preset_path), "--wait", "--json"]
    for s in sets:
        argv += ["--set", s]
    print(
        "$ tunedeck launch",
        preset_path.relative_to(REPO) if preset_path.is_relative_to(REPO) else preset_path,
        *[f"--set {s}" for s in sets],
        "--wait --json",
        flush=True,
    )
    t0 = time.time()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n")
    if not proc.stdout.strip().startswith("{"):  # refused before a run existed (preflight)
        print("$ (again, --no-preflight)", flush=True)
        proc = subprocess.run(
            argv + ["--no-preflight"], cwd=REPO, env=env, capture_output=True, text=True
        )
        print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n")
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    print(f"$ tunedeck metrics {run_id} --json", flush=True)
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
    for r in recs:
        print(
            json.dumps({k: r.get(k) for k in ("step", "loss", "step_s", "tokens_per_s", "mem_gib")})
        )
    steady = [r for r in recs if r["step"] > a.warmup and r.get("tokens_per_s")]
    run_dir = out / "home" / "runs" / run_id
    phases = []
    ev = run_dir / "events" / "rank0.jsonl"
    if ev.exists():
        evs = [json.loads(x) for x in ev.read_text().splitlines() if x.strip()]
        phases = [e for e in evs if e.get("kind") == "phase"]
        steps = [e for e in evs if e.get("kind") == "step" and e["step"] > a.warmup]
    else:
        steps = []
    result = {
        "run_id": run_id,
        "exit_code": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "steps": len(recs),
        "tokens_per_s_metrics": round(statistics.median(r["tokens_per_s"] for r in steady))
        if steady
        else None,
        "label_tokens_per_s_events": round(
            statistics.median(e["label_tokens"] / e["step_s"] for e in steps)
        )
        if steps
        else None,
        "mfu_events": round(statistics.median(e["mfu"] for e in steps), 3)
        if steps and steps[0].get("mfu")
        else None,
        "mem_gib": max((e["mem_gib"] for e in steps), default=None),
        "mem_reserved_gib": max((e.get("mem_reserved_gib") or 0 for e in steps), default=None),
        "phases": [
            {k: p.get(k) for k in ("phase", "step", "est_s", "compile_s", "graphs", "shape")}
            for p in phases
        ],
        "loss_first": recs[0].get("loss") if recs else None,
        "loss_last": recs[-1].get("loss") if recs else None,
        "losses": [r.get("loss") for r in recs],
    }
    print(json.dumps(result))
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
