"""This node's disk, shared memory, CPU cores and RAM against what the run will use."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tunedeck.core.preflight.base import CheckResult, Context, result

GIB = 2**30
SHM = Path("/dev/shm")
SHM_MIN_PER_WORKER = 256 * 2**20  # batches + pinned copies in flight, with slack


def _output_dir(ctx: Context) -> Path:
    from tunedeck.core.paths import runs_root

    o = ctx.spec.run.output_dir
    return Path(o).expanduser() if o else runs_root()


def _n_checkpoints(ctx: Context) -> int:
    t = ctx.spec.train
    saves = (t.max_steps // t.save_steps if t.save_steps else 0) + 1
    return min(saves, t.save_total_limit) if t.save_total_limit else saves


def check_output_dir(ctx: Context) -> CheckResult:
    id, title = "host.output_dir", "Output directory writable with room for checkpoints"
    out = _output_dir(ctx)
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return result(
            id,
            title,
            "fail",
            f"{out}: cannot be created: {probe} is a file",
            "choose another run.output_dir",
        )
    try:  # really write: os.access says yes to root on read-only mounts
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".tunedeck-preflight-"):
            pass
    except OSError as e:
        return result(
            id,
            title,
            "fail",
            f"{out}: not writable ({probe}: {e.strerror})",
            "choose a writable run.output_dir (or $TUNEDECK_HOME)",
        )
    free = shutil.disk_usage(probe).free
    est = ctx.estimate
    n = _n_checkpoints(ctx)
    if isinstance(est, str):
        return result(
            id,
            title,
            "pass",
            f"{out} writable, {free / GIB:.1f} GiB free (checkpoint size unknown: no model config)",
        )
    need = est.memory.checkpoint_bytes * n
    detail = (
        f"{out} writable; {n} checkpoint(s) × {est.memory.checkpoint_bytes / GIB:.2f} GiB"
        f" = {need / GIB:.1f} GiB, {free / GIB:.1f} GiB free"
    )
    limit_fix = (
        "set train.save_total_limit"
        if not ctx.spec.train.save_total_limit
        else "lower train.save_total_limit"
    )
    if need > free:
        return result(
            id,
            title,
            "fail",
            detail,
            f"free disk space, {limit_fix}, or choose another run.output_dir",
        )
    if need > 0.8 * free:
        return result(id, title, "warn", detail, limit_fix)
    return result(id, title, "pass", detail)


def check_shm(ctx: Context, shm: Path = SHM) -> CheckResult:
    id, title = "host.shm", "/dev/shm large enough for dataloader workers"
    w = ctx.spec.data.num_workers
    if w == 0:
        return result(
            id,
            title,
            "skip",
            "data.num_workers = 0: batches load in each rank, no shared memory used",
        )
    if not shm.is_dir():
        return result(
            id,
            title,
            "fail",
            f"{shm} does not exist; DataLoader workers need it",
            "mount a tmpfs on /dev/shm or set data.num_workers = 0",
        )
    du = shutil.disk_usage(shm)
    procs = ctx.procs_per_node()
    run = ctx.run
    batch = run.train.per_device_batch_size * run.data.max_length * 8 * 3  # ids, labels, mask
    need = procs * w * max(2 * batch, SHM_MIN_PER_WORKER)
    detail = (
        f"{du.free / GIB:.2f} GiB free of {du.total / GIB:.2f} GiB for {procs} "
        f"rank(s) × {w} worker(s) (want ≥ {need / GIB:.2f} GiB)"
    )
    fix = "docker run --shm-size=16g (or --ipc=host); or lower data.num_workers"
    if du.free < need:
        # as many workers per rank as the free space holds (0: load in the rank itself)
        fits = int(du.free // (procs * max(2 * batch, SHM_MIN_PER_WORKER)))
        return result(
            id,
            title,
            "fail",
            detail + "; workers die with 'bus error'",
            fix,
            {"data.num_workers": min(fits, w - 1)},
        )
    return result(id, title, "pass", detail)


def check_cpu_cores(ctx: Context) -> CheckResult:
    id, title = "host.cores", "Dataloader workers × processes vs CPU cores"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    procs = ctx.procs_per_node()
    w = ctx.spec.data.num_workers
    busy = procs * (1 + w)
    detail = f"{procs} rank(s) × (1 + {w} worker(s)) = {busy} busy processes on {cores} cores"
    if busy > cores:
        fit = max(cores // procs - 1, 0)
        return result(
            id,
            title,
            "warn",
            detail + ": workers will fight for CPU",
            f"set data.num_workers ≤ {fit}",
            {"data.num_workers": fit},
        )
    return result(id, title, "pass", detail)


def check_host_ram(ctx: Context) -> CheckResult:
    id, title = "host.ram", "Host RAM for loading the weights in every process"
    import psutil

    est = ctx.estimate
    if isinstance(est, str):
        return result(id, title, "skip", est)
    procs = ctx.procs_per_node()
    per = est.memory.host_load_bytes + est.memory.cpu_offload_bytes
    need = per * procs
    avail = psutil.virtual_memory().available
    detail = (
        f"{procs} process(es) × {per / GIB:.1f} GiB (weights"
        f"{' + offloaded states' if est.memory.cpu_offload_bytes else ''}) = "
        f"{need / GIB:.1f} GiB; {avail / GIB:.1f} GiB available"
    )
    if need > avail:
        return result(
            id,
            title,
            "fail",
            detail + ": the kernel would OOM-kill ranks at load",
            "load on fewer processes at once, add RAM/swap, or shard the load "
            "(FSDP2/ZeRO-3 with low-memory loading)",
        )
    if need > 0.8 * avail:
        return result(id, title, "warn", detail, "close other jobs on this node")
    return result(id, title, "pass", detail)


CHECKS = [check_output_dir, check_shm, check_cpu_cores, check_host_ram]
