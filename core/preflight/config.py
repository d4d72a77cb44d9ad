"""The spec against itself: memory fit, effective batch, backend versions, checkpointing, and
the launch command itself (built exactly as `tunedeck launch` would)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.backends import BACKENDS, plan_run
from tunedeck.core.backends.torchrun import torchrun_argv
from tunedeck.core.estimate.batch import data_parallel_size, effective_batch
from tunedeck.core.paths import runs_root
from tunedeck.core.estimate.fit import Fit, fit
from tunedeck.core.preflight.base import CheckResult, Context, result
from tunedeck.core.preflight.gpu import chosen
from tunedeck.core.rundir import RunDir
from tunedeck.core.backends.swift.flags import FlagTableError
from tunedeck.core.backends.run_estimate import as_run, length_is_bound, length_unless_steps
from tunedeck.core.telemetry.gpus import Gpu

LONG_RUN_STEPS = 1000
SEVERITY = {"pass": 0, "warn": 1, "fail": 2}


@dataclass
class GpuFit:
    """One GPU the run uses, and the memory estimate's verdict on it (`fit`)."""

    gpu: Gpu
    fit: Fit

    @property
    def line(self) -> str:
        g, f = self.gpu, self.fit
        return f"GPU{g.index} {g.name} {g.memory_total_gib:.1f} GiB: {f.reason} ({f.share:.0%})"


def gpu_fits(ctx: Context) -> list[GpuFit]:
    """The estimate against each GPU the run uses (cluster.gpus, else CUDA_VISIBLE_DEVICES,
    else all; all when the selection names none that exist), one `fit` each. Empty without an
    estimate, off CUDA, or with no GPU to compare with. Preflight's memory check and the
    preview both read it, so they cannot disagree."""
    est = ctx.estimate
    if isinstance(est, str) or ctx.resolved.cluster.device != "cuda":
        return []
    per = est.memory.per_gpu_gib
    # sized at the longest sample ms-swift allows: short data may well fit, so not a wall
    bound = ctx.run.data.max_length if length_is_bound(ctx.spec) else None
    return [GpuFit(g, fit(per, g.memory_total_gib, bound)) for g in chosen(ctx) or ctx.gpus.gpus]


def worst(fits: list[GpuFit]) -> GpuFit:
    """The verdict that decides: the most severe, on the smallest GPU among equals."""
    return max(fits, key=lambda f: (SEVERITY[f.fit.status], -f.gpu.memory_total_gib))


def check_gpu_memory(ctx: Context) -> CheckResult:
    id, title = "mem.fit", "Estimated GPU memory vs capacity"
    est = ctx.estimate
    if isinstance(est, str):
        return result(
            id,
            title,
            "warn",
            f"no estimate: {est}",
            "point model.path at a folder with config.json",
        )
    per = est.memory.per_gpu_gib
    parts = ", ".join(f"{k} {v:.1f}" for k, v in est.memory.breakdown.items() if v >= 0.05)
    if ctx.resolved.cluster.device != "cuda":
        return result(id, title, "skip", f"device cpu (≈{per:.2f} GiB per process: {parts})")
    fits = gpu_fits(ctx)
    if not fits:
        return result(
            id,
            title,
            "skip",
            f"no GPU visible to compare with; estimate {per:.1f} GiB per GPU ({parts})",
        )
    w = worst(fits)
    detail = f"≈{per:.1f} GiB per GPU of {w.gpu.memory_total_gib:.0f} GiB ({parts})"
    if w.fit.status == "pass":
        return result(id, title, "pass", detail)
    fix = (
        "enable train.gradient_checkpointing, lower per_device_batch_size / "
        "data.max_length, or shard (`tunedeck estimate` suggests a strategy)"
    )
    if length_is_bound(ctx.spec) and per > w.gpu.memory_total_gib:
        fix = "set data.max_length to the data's longest sample; " + fix
    # the one value that always helps; whether it is enough shows on the next run
    gc = None if ctx.run.train.gradient_checkpointing else {"train.gradient_checkpointing": True}
    return result(id, title, w.fit.status, f"{detail}: {w.fit.reason}", fix, gc)


def _world(spec) -> int:
    return max(spec.cluster.nproc_per_node, 1) * spec.cluster.nnodes


def check_effective_batch(ctx: Context) -> CheckResult:
    id, title = "train.batch", "Effective batch size (vs the preset)"
    run = ctx.run  # Megatron ranks that split one model count once, as in compose
    world = ctx.procs_per_node() * run.cluster.nnodes
    t, dp = run.train, data_parallel_size(run, world)
    eff = effective_batch(run, world)
    detail = (
        f"{eff} = {t.per_device_batch_size} per device × {t.grad_accum} accumulation × "
        f"{dp} data-parallel rank(s)"
    )
    base = ctx.base
    if base is not None:
        from tunedeck.core.estimate.resolve import resolve

        rb = as_run(resolve(base, gpu_count=len(ctx.gpus.gpus)))[0]
        beff = effective_batch(rb, _world(rb))
        if beff != eff:
            # keep the file's batch by accumulation alone, when it divides evenly
            per_step = t.per_device_batch_size * dp
            keep = (
                {"train.grad_accum": beff // per_step}
                if beff % per_step == 0 and beff >= per_step
                else None
            )
            return result(
                id,
                title,
                "warn",
                f"{detail}; the spec file gives {beff}",
                f"scale train.learning_rate by about {eff / beff:.2g}× (or keep the "
                "batch with train.grad_accum)",
                keep,
            )
    return result(id, title, "pass", detail)


# (distribution, minimal version, why), by what the spec uses
def _requirements(spec) -> list[tuple[str, str, str]]:
    backend = BACKENDS.get(spec.backend)
    req = backend.requirements(spec) if backend else []
    p = spec.parallel
    if p.strategy == "fsdp2":
        req.append(("torch", "2.4", "parallel.strategy fsdp2"))
        if not traits_of(spec.backend).own_trainer:
            req.append(("accelerate", "1.6", "FSDP2 in HF Trainer"))
    if p.strategy == "deepspeed":
        req.append(
            (
                "deepspeed",
                "0.14",
                f"ZeRO-{p.zero_stage}" + (" offload" if p.zero_offload != "none" else ""),
            )
        )
    if p.strategy == "megatron":
        req.append(("megatron-core", "0.12", "parallel.strategy megatron"))
    if spec.method.type == "qlora":
        req.append(("bitsandbytes", "0.43", f"QLoRA {spec.method.quant_bits}-bit"))
    if spec.model.attn_impl == "flash_attention_2":
        req.append(("flash-attn", "2.5", "model.attn_impl flash_attention_2"))
    return req


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def check_backend(ctx: Context) -> CheckResult:
    id, title = "env.backend", "Backend packages installed at versions that know the flags"
    seen, ok, problems, wanted = set(), [], [], []
    for dist, minimum, why in _requirements(ctx.spec):
        if (dist, minimum) in seen:
            continue
        seen.add((dist, minimum))
        try:
            v = metadata.version(dist)
        except metadata.PackageNotFoundError:
            problems.append(f"{dist} not installed (needed for {why})")
            wanted.append(f"'{dist}>={minimum}'")
            continue
        if _vtuple(v) < _vtuple(minimum):
            problems.append(f"{dist} {v} < {minimum} (needed for {why})")
            wanted.append(f"'{dist}>={minimum}'")
        else:
            ok.append(f"{dist} {v}")
    detail = ", ".join(dict.fromkeys(ok))
    if problems:
        return result(
            id,
            title,
            "fail",
            "; ".join(problems) + (f"; ok: {detail}" if ok else ""),
            "pip install " + " ".join(dict.fromkeys(wanted)),
        )
    return result(id, title, "pass", detail or "nothing to check")


def check_saving(ctx: Context) -> CheckResult:
    id, title = "train.saving", "Checkpoint saving configured"
    t = ctx.run.train  # an ms-swift run saves every 500 steps unless told otherwise
    keep = f", keeping the newest {t.save_total_limit}" if t.save_total_limit else ""
    length = length_unless_steps(ctx.spec)
    if length:  # ms-swift's epochs: no step count to compare with
        every = (
            f"every {t.save_steps} steps{keep}"
            if t.save_steps
            else "as ms-swift's save strategy says"
        )
        return result(id, title, "pass", f"{every}; {length}")
    if t.save_steps:
        if t.save_steps > t.max_steps:
            return result(
                id,
                title,
                "warn",
                f"save_steps {t.save_steps} > max_steps {t.max_steps}: only the final checkpoint",
                "lower train.save_steps",
                {"train.save_steps": max(t.max_steps // 10, 1)},
            )
        return result(id, title, "pass", f"every {t.save_steps} steps{keep}")
    est = ctx.estimate
    long_run = t.max_steps >= LONG_RUN_STEPS
    eta = ""
    if not isinstance(est, str) and est.throughput:
        long_run = long_run or est.throughput.eta_s > 3600
        from tunedeck.core.estimate import fmt_duration

        eta = f" (≈{fmt_duration(est.throughput.eta_s)})"
    if long_run:
        return result(
            id,
            title,
            "warn",
            f"save_steps = 0: {t.max_steps} steps{eta} with a "
            "checkpoint only at the end or on a graceful stop; a crash loses it all",
            f"set train.save_steps (e.g. {max(t.max_steps // 10, 1)})",
            {"train.save_steps": max(t.max_steps // 10, 1)},
        )
    return result(
        id,
        title,
        "pass",
        f"short run ({t.max_steps} steps{eta}): checkpoint at the end and on stop",
    )


def check_spec(ctx: Context) -> CheckResult:
    """The rules between keys that loading a file enforces, for a spec that came from a form
    or a run (no file was loaded, so nothing checked them yet)."""
    from tunedeck.core.spec import cross_checks

    id, title = "spec.valid", "Spec keys agree with each other"
    problems = cross_checks(ctx.spec)
    if problems:
        return result(id, title, "fail", "; ".join(problems), "change the keys named")
    return result(
        id,
        title,
        "pass",
        f"{ctx.spec.backend} backend, {ctx.spec.method.type}, {ctx.spec.parallel.strategy}",
    )


def check_plan(ctx: Context) -> CheckResult:
    id, title = "spec.plan", "The launch command can be built"
    try:
        spec, plan = plan_run(
            ctx.spec, RunDir(runs_root() / "<run-id>"), gpu_count=len(ctx.gpus.gpus)
        )
    except FlagTableError as e:  # ms-swift missing or broken: env.backend says what to do
        return result(id, title, "skip", f"ms-swift's flags could not be read: {e}")
    except ValueError as e:
        return result(id, title, "fail", str(e), "change the spec key the message names")
    node = min(spec.cluster.node_rank, len(plan.nodes) - 1)
    # what torchrun runs, after its own flags: `-m tunedeck.core.train ...`, `-m swift.cli.sft`
    target = plan.nodes[node].argv[len(torchrun_argv(spec, RunDir("<run-id>"), node)) :]
    shown = " ".join(target[:2]) + (f" + {len(target) - 2} arguments" if len(target) > 2 else "")
    return result(
        id,
        title,
        "pass",
        f"torchrun on {plan.nnodes} node(s) x {plan.nproc_per_node} rank(s) runs {shown}",
    )


CHECKS = [
    check_spec,
    check_plan,
    check_gpu_memory,
    check_effective_batch,
    check_backend,
    check_saving,
]
