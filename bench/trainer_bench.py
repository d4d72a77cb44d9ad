"""Built-in trainer throughput, side by side with the plain-PyTorch anchor loop.

The trainer part runs tunedeck.core.train's own Trainer (same loop, loss module, DDP/FSDP2 wrapping,
events) on a model built from a Qwen2.5 config (random init, no download) and synthetic data:

  padded   batch × seq tokens of random ids, every token labelled (the anchor's batches)
  chat     variable-length chat-like samples (prompt unlabelled, reply labelled), padded
  packed   the same samples, packed padding-free (one flat row, document-aware attention)
  fsdp2    full fine-tuning under FSDP2

Worker (under torchrun):  python bench/trainer_bench.py run --case padded --out DIR ...
Table:                    python bench/trainer_bench.py table OUTDIR
CPU self-test:            bench/trainer_bench.sh OUTDIR --tiny
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()  # tunedeck from this checkout unless installed

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocab, tied (Qwen2.5 configs)
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
    "tiny": (128, 352, 4, 4, 2, 1024, True),  # CPU self-test
    "small": (512, 1536, 4, 8, 2, 8192, False),  # a quick GPU check
}


def qwen_config(size: str):
    from transformers import Qwen2Config

    h, inter, layers, heads, kv, vocab, tie = SIZES[size]
    return Qwen2Config(
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        max_position_embeddings=32768,
        rope_theta=1e6,
    )


class _Tok:
    """All the trainer needs of a tokenizer for synthetic data."""

    pad_token_id = 0
    eos_token_id = 0

    def save_pretrained(self, _path):  # checkpoints are off in the bench
        pass


class _Samples:
    def __init__(self, samples):
        self.samples, self.tokenizer = samples, _Tok()

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def synthetic(case: str, n: int, seq: int, vocab: int, seed: int):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if case in ("padded", "fsdp2"):
            ids = [rng.randrange(1, vocab) for _ in range(seq)]
            out.append({"input_ids": ids, "labels": list(ids)})
            continue
        # Chat-like: lengths log-normal around ~400 tokens, capped at seq; the reply (about
        # the second half) is labelled.
        k = max(16, min(seq, int(rng.lognormvariate(5.8, 0.8))))
        ids = [rng.randrange(1, vocab) for _ in range(k)]
        cut = k // 2
        out.append({"input_ids": ids, "labels": [-100] * cut + ids[cut:]})
    return _Samples(out)


def run(a) -> int:
    import os

    # as the trainer's own entry point does, before CUDA starts
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch

    from tunedeck.core.spec import RunSpec
    from tunedeck.core.rundir.events import EventWriter
    from tunedeck.core.train.model import prepare
    from tunedeck.core.train.trainer import StopFlag, Trainer, init_distributed

    spec = RunSpec(name=f"bench-{a.case}")
    spec.cluster.device = "cpu" if a.size == "tiny" else "cuda"
    spec.model.dtype = "float32" if a.size == "tiny" else "bfloat16"
    spec.model.attn_impl = "sdpa"
    spec.method.type = "full" if a.case == "fsdp2" else "lora"
    spec.method.lora_rank, spec.method.lora_alpha, spec.method.lora_dropout = 8, 32, 0.0
    spec.parallel.strategy = "fsdp2" if a.case == "fsdp2" else "ddp"
    spec.data.packing = a.case == "packed"
    spec.data.max_length = a.seq
    spec.train.per_device_batch_size = a.bs
    spec.train.max_steps = a.warmup + a.steps
    spec.train.gradient_checkpointing = a.ckpt
    if a.preset:
        # the preset's own method and batch settings (model and data stay synthetic)
        from tunedeck.core.spec import load_spec

        p = load_spec(Path(a.preset))
        spec.method.lora_rank, spec.method.lora_alpha = p.method.lora_rank, p.method.lora_alpha
        spec.method.target_modules = p.method.target_modules
        spec.train.per_device_batch_size = p.train.per_device_batch_size
        spec.train.grad_accum = p.train.grad_accum
        spec.train.gradient_checkpointing = p.train.gradient_checkpointing
        spec.train.compile = p.train.compile
        spec.method.fp8_base = p.method.fp8_base
    if a.eager:
        spec.train.compile = False
    if a.fp8 is not None:
        spec.method.fp8_base = a.fp8
    spec.train.learning_rate = 1e-4
    spec.run.output_dir = str(Path(a.out) / "output")

    d = init_distributed(spec)
    from tunedeck.core.train.model import compute_dtype

    dtype = compute_dtype(spec.model.dtype, d.device)
    cfg = qwen_config(a.size)
    cfg._attn_implementation = "sdpa"
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    # LoRA: frozen base in bf16, like the anchor. Full: fp32 master weights (FSDP2 shards them).
    load = dtype if spec.method.type == "lora" else torch.float32
    with torch.device(d.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=load)
    model = prepare(spec, model, d.device)
    per_step = spec.train.per_device_batch_size * spec.train.grad_accum * d.world_size
    n = max(64, per_step * (a.warmup + a.steps) * (6 if a.case != "padded" else 1))
    data = synthetic(a.case, n, a.seq, cfg.vocab_size, seed=1)
    events = EventWriter(a.out, d.rank)
    tr = Trainer(
        spec,
        Path(a.out),
        d,
        events,
        StopFlag(),
        model=model,
        tokenizer=_Tok(),
        datasets=(data, None),
    )
    tr.save_at_end = False
    if a.profile and d.rank == 0:
        _profile_one_step(tr, a.warmup, Path(a.out) / "profile.txt")
    try:
        tr.run()
    finally:
        events.close()
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


KERNEL_KINDS = (  # first match wins; names as cuBLAS, cuDNN, flash and Inductor give them
    # Inductor names a kernel after the ops it fused (triton_red_fused__scaled_mm_...): first
    ("inductor fused", ("triton_",)),
    ("matrix products", ("gemm", "nvjet", "cutlass", "scaled_mm", "sm90_xmma", "cublas")),
    ("attention", ("fmha", "flash", "cudnn", "attention", "sdpa")),
    ("copies", ("memcpy", "direct_copy")),
)
# tunedeck's own Triton GEMMs (lora_triton, lora_rank), by their exact names ("rows" alone is
# too common a word to match inside other kernels' names)
OWN_PRODUCTS = frozenset(("mm_persistent", "lora_mm", "strips", "rows"))


def kernel_kind(name: str) -> str:
    """The kind a profiled kernel's time counts under (KERNEL_KINDS; "other" if none)."""
    if name in OWN_PRODUCTS:
        return "matrix products"
    low = name.lower()
    return next((k for k, keys in KERNEL_KINDS if any(x in low for x in keys)), "other")


def kernel_summary(avg, wall_s: float) -> str:
    """GPU time of the profiled step by kind of kernel, against its wall time."""
    from torch.autograd import DeviceType

    # CPU ops (aten::mm) and record_function ranges (DistributedDataParallel.forward) carry
    # their kernels' time too: count the kernels themselves only. Inductor's launchers are CPU
    # events named as their kernels: those names stay.
    cpu = {
        e.key for e in avg if e.device_type == DeviceType.CPU and not e.key.startswith("triton_")
    }
    by: dict[str, float] = {}
    for e in avg:
        if e.device_type != DeviceType.CUDA or e.key in cpu or e.key.startswith("aten::"):
            continue
        kind = kernel_kind(e.key)
        by[kind] = by.get(kind, 0.0) + e.self_device_time_total / 1e3  # µs -> ms
    gpu = sum(by.values())
    lines = [f"step wall {wall_s * 1e3:.1f} ms, GPU busy {gpu:.1f} ms"]
    lines += [
        f"  {k:<16} {v:8.1f} ms {v / max(gpu, 1e-9):6.1%}"
        for k, v in sorted(by.items(), key=lambda kv: -kv[1])
    ]
    return "\n".join(lines) + "\n\n"


def gap_summary(trace: Path, top: int = 12) -> str:
    """Where the GPU idles in a chrome trace: the idle time between kernels (all streams), and
    for each gap whether the next kernel was launched only after the GPU ran dry (the CPU is
    behind) or before (it waited on something else), grouped by the top-level CPU range that
    launched it."""
    import bisect

    ev = json.loads(trace.read_text())["traceEvents"]
    gpu = sorted(
        (
            e
            for e in ev
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        ),
        key=lambda e: e["ts"],
    )
    if not gpu:
        return "no kernels in the trace\n"
    launch = {
        e["args"]["correlation"]: e
        for e in ev
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    # top-level CPU ranges per thread (ops and annotations not inside another)
    tops: dict = {}
    for e in sorted(
        (e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")),
        key=lambda e: (e["ts"], -e.get("dur", 0)),
    ):
        lst = tops.setdefault(e["tid"], [])
        if not lst or e["ts"] >= lst[-1]["ts"] + lst[-1]["dur"]:
            lst.append(e)
    starts = {t: [e["ts"] for e in lst] for t, lst in tops.items()}

    def where(lc) -> str:
        if lc is None:
            return "(no launch record)"
        lst, st = tops.get(lc["tid"], []), starts.get(lc["tid"], [])
        i = bisect.bisect_right(st, lc["ts"]) - 1
        if i >= 0 and lc["ts"] <= lst[i]["ts"] + lst[i]["dur"]:
            return lst[i]["name"][:70]
        return "(outside any op)"

    idle = {"cpu behind": 0.0, "waiting": 0.0}
    by: dict = {}
    end = gpu[0]["ts"] + gpu[0]["dur"]
    busy = 0.0
    for k in gpu:
        s0, s1 = k["ts"], k["ts"] + k["dur"]
        busy += max(0.0, s1 - max(s0, end)) if s0 < end else k["dur"]
        gap = s0 - end
        if gap > 5:  # µs
            lc = launch.get(k.get("args", {}).get("correlation"))
            kind = "cpu behind" if lc is not None and lc["ts"] > end else "waiting"
            idle[kind] += gap
            key = (kind, where(lc))
            n, t = by.get(key, (0, 0.0))
            by[key] = (n + 1, t + gap)
        end = max(end, s1)
    span = end - gpu[0]["ts"]
    lines = [
        f"trace span {span / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms, idle "
        f"{(idle['cpu behind'] + idle['waiting']) / 1e3:.1f} ms (CPU behind "
        f"{idle['cpu behind'] / 1e3:.1f}, waiting {idle['waiting'] / 1e3:.1f})"
    ]
    for (kind, name), (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {t / 1e3:8.1f} ms {n:6d} gaps  {kind:<10}  {name}")
    return "\n".join(lines) + "\n\n"


def _profile_one_step(tr, warmup: int, out: Path) -> None:
    """torch.profiler over the step after the warm-up; the top kernels by GPU time to `out`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    box = {}

    def start(done: int) -> None:
        if done == warmup:
            box["p"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            box["p"].__enter__()
            box["t0"] = time.perf_counter()

    def stop(done: int) -> None:
        if done == warmup + 1 and "p" in box:
            torch.cuda.synchronize()
            wall = time.perf_counter() - box["t0"]
            box["p"].__exit__(None, None, None)
            avg = box["p"].key_averages()
            trace = out.with_name("trace.json")
            box["p"].export_chrome_trace(str(trace))
            try:
                gaps = gap_summary(trace)
            except Exception as e:  # the summary must not cost the profile
                gaps = f"gap summary failed: {e!r}\n\n"
            out.write_text(
                kernel_summary(avg, wall)
                + gaps
                + avg.table(
                    sort_by="self_device_time_total", row_limit=40, max_name_column_width=90
                )
            )

    tr.before_step.append(start)
    tr.after_step.append(stop)


def summarize(case_dir: Path, warmup: int) -> dict | None:
    from tunedeck.core.rundir.events import read_events

    ranks = sorted(case_dir.glob("events/rank*.jsonl"))
    if not ranks:
        return None
    per_rank = []
    for f in ranks:
        steps = [e for e in read_events(f) if e["kind"] == "step"][warmup:]
        if not steps:
            return None
        med = statistics.median(e["step_s"] for e in steps)
        toks = statistics.mean(e["tokens"] for e in steps)
        labels = statistics.mean(e.get("label_tokens", e["tokens"]) for e in steps)
        mfus = [e["mfu"] for e in steps if e.get("mfu") is not None]
        per_rank.append(
            dict(
                tokens_per_s=toks / med,
                step_s=med,
                tokens=toks,
                label_tokens_per_s=labels / med,
                mem_gib=max(e["mem_gib"] for e in steps),
                reserved_gib=max(e.get("mem_reserved_gib") or 0 for e in steps),
                mfu=statistics.median(mfus) if mfus else None,
            )
        )
    ev0 = read_events(ranks[0])
    start = next(e for e in ev0 if e["kind"] == "start")
    done = [e for e in ev0 if e["kind"] == "phase" and e.get("phase") == "training"]
    return dict(
        world=start["world_size"],
        method=start["method"],
        strategy=start["strategy"],
        tokens_per_s_per_gpu=statistics.mean(r["tokens_per_s"] for r in per_rank),
        step_s=statistics.mean(r["step_s"] for r in per_rank),
        peak_mem_gib=max(r["mem_gib"] for r in per_rank),
        reserved_gib=max(r["reserved_gib"] for r in per_rank),
        label_tokens_per_s=statistics.mean(r["label_tokens_per_s"] for r in per_rank),
        compiles=len(done),
        graphs=done[-1]["graphs"] if done else 0,
        compile_s=round(sum(e["compile_s"] for e in done), 1),
        fallback=any(e.get("phase") == "eager_fallback" for e in ev0),
        mfu=per_rank[0]["mfu"],
    )


def _json_lines(case_dir: Path) -> list[dict]:
    out = []
    for f in sorted(case_dir.glob("*.log")):
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def table(out: Path, warmup: int) -> str:
    """One row per case: tokens/s/GPU (labelled tokens/s where not all tokens carry loss),
    peak allocated and reserved GiB, MFU (989 TFLOP/s dense bf16 peak), compiles."""
    rows = []  # name, world, tok/s, label tok/s, alloc, reserved, mfu, note
    for case_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        if case_dir.name.startswith(("anchor", "unsloth")):
            res = [r for r in _json_lines(case_dir) if "tokens_per_s_per_gpu" in r]
            if res:
                tps = statistics.mean(r["tokens_per_s_per_gpu"] for r in res)
                rows.append(
                    (
                        case_dir.name,
                        res[0].get("world", 1),
                        tps,
                        tps,
                        max(r["peak_mem_gib"] for r in res),
                        max(r.get("peak_reserved_gib") or 0 for r in res),
                        res[0]["tflops_per_gpu"] / 989.0,
                        "",
                    )
                )
            continue
        s = summarize(case_dir, warmup)
        if s:
            note = (
                f"{s['compiles']} compiles, {s['graphs']} graphs, {s['compile_s']} s"
                if s["compiles"]
                else ("eager (compile failed)" if s["fallback"] else "eager")
            )
            rows.append(
                (
                    case_dir.name,
                    s["world"],
                    s["tokens_per_s_per_gpu"],
                    s["label_tokens_per_s"],
                    s["peak_mem_gib"],
                    s["reserved_gib"],
                    s["mfu"],
                    note,
                )
            )
    lines = [
        "| case | GPUs | tokens/s/GPU | labelled tokens/s | peak alloc GiB | "
        "peak reserved GiB | MFU | compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, world, tps, ltps, mem, res, m, note in rows:
        lines.append(
            f"| {name} | {world} | {tps:,.0f} | {ltps:,.0f} | {mem:.1f} | {res:.1f} | "
            f"{'n/a' if m is None else f'{100 * m:.1f} %'} | {note} |"
        )
    by = {r[0]: r for r in rows}
    notes = []
    base = "anchor-1"
    for name in by:
        if name != base and base in by and by[name][1] == 1:
            notes.append(f"{name} / {base}: {by[name][2] / by[base][2]:.3f}")
    for ours in ("ours-default-1", "ours-padded-1"):
        if ours in by and "anchor-liger-1" in by:
            notes.append(
                f"{ours} / anchor-liger-1: {by[ours][2] / by['anchor-liger-1'][2]:.3f}"
                f" (reserved {by[ours][5]:.1f} vs {by['anchor-liger-1'][5]:.1f} GiB)"
            )
    ref = by.get("ours-default-1") or by.get("ours-padded-1")
    if ref:
        for chat in ("ours-chat-padded-1", "ours-chat-packed-1"):
            if chat in by:
                notes.append(
                    f"{chat} vs {ref[0]} (fixed-length random tokens, all labelled): "
                    f"tokens {by[chat][2] / ref[2]:.2f}x, labelled tokens "
                    f"{by[chat][3] / ref[3]:.2f}x"
                )
    if "ours-chat-padded-1" in by and "ours-chat-packed-1" in by:
        notes.append(
            f"packed vs padded chat (labelled tokens/s): "
            f"{by['ours-chat-packed-1'][3] / by['ours-chat-padded-1'][3]:.2f}x"
        )
    text = "\n".join(lines + [""] + notes) + "\n"
    (out / "table.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one case, as a torchrun worker")
    r.add_argument("--case", choices=("padded", "chat", "packed", "fsdp2"), required=True)
    r.add_argument("--size", choices=tuple(SIZES), default="7b")
    r.add_argument("--seq", type=int, default=2048)
    r.add_argument("--bs", type=int, default=4)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--ckpt", action="store_true", help="gradient checkpointing")
    r.add_argument("--compile", action="store_true", help="(the default now)")
    r.add_argument("--eager", action="store_true", help="train.compile = false")
    r.add_argument("--fp8", action="store_true", default=None, help="method.fp8_base = true")
    r.add_argument(
        "--no-fp8",
        action="store_false",
        dest="fp8",
        help="method.fp8_base = false (the preset's products in bf16)",
    )
    r.add_argument("--preset", help="take method and batch settings from this spec file")
    r.add_argument("--profile", action="store_true", help="profile the step after warm-up")
    r.add_argument("--out", required=True)
    t = sub.add_parser("table", help="print/write the comparison table")
    t.add_argument("out")
    t.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        return run(a)
    print(table(Path(a.out), a.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
