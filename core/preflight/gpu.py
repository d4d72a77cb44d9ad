"""GPU checks: count, uniformity, bf16, fp8 (method.fp8_base), driver vs CUDA build, device
order, NCCL, interconnect.

The facts come from core/telemetry/gpus.py (`ctx.gpus`, probed once per context). `GpuFacts`
is plain data: tests build one by hand to exercise the rules.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.preflight.base import CheckResult, Context, result
from tunedeck.core.spec import FP8_MIN_CC
from tunedeck.core.telemetry.gpus import Gpu


def _wants_gpu(ctx: Context) -> bool:
    return ctx.resolved.cluster.device == "cuda"


def _skip_cpu(ctx: Context, id: str, title: str) -> CheckResult | None:
    if _wants_gpu(ctx):
        return None
    why = (
        "cluster.device = cpu"
        if ctx.spec.cluster.device == "cpu"
        else "no GPU visible, the run resolves to device cpu"
    )
    return result(id, title, "skip", f"not applicable: {why}")


def chosen(ctx: Context) -> list[Gpu]:
    """The GPUs the run will use: cluster.gpus, else CUDA_VISIBLE_DEVICES, else all."""
    facts = ctx.gpus
    sel = ctx.spec.cluster.gpus or os.environ.get("CUDA_VISIBLE_DEVICES")
    if sel is None or not sel.strip():
        return list(facts.gpus)
    by_index = {str(g.index): g for g in facts.gpus}
    return [by_index[s.strip()] for s in sel.split(",") if s.strip() in by_index]


def check_gpu_count(ctx: Context) -> CheckResult:
    id, title = "gpu.count", "GPUs visible for the requested processes"
    c = ctx.spec.cluster
    if c.device == "cpu" or (c.device == "auto" and not ctx.resolved.cluster.device == "cuda"):
        return _skip_cpu(ctx, id, title)
    facts = ctx.gpus
    want = c.nproc_per_node or 1
    asked = f"cluster.device = {c.device}, nproc_per_node = {c.nproc_per_node}" + (
        f", gpus = {c.gpus!r}" if c.gpus else ""
    )
    if not facts.gpus:
        return result(
            id,
            title,
            "fail",
            f"the spec asks for {want} GPU(s) ({asked}) but none "
            f"are visible ({facts.error or 'NVML found 0 devices'})",
            'run on a GPU node, or set cluster.device = "cpu"',
            {"cluster.device": "cpu"},
        )
    sel = c.gpus or os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [s.strip() for s in sel.split(",") if s.strip()] if sel else []
    known = {str(g.index) for g in facts.gpus}
    unknown = [i for i in ids if i not in known and not i.startswith("GPU-")]
    if unknown:
        src = "cluster.gpus" if c.gpus else "CUDA_VISIBLE_DEVICES"
        return result(
            id,
            title,
            "fail",
            f"{src} names GPU(s) {', '.join(unknown)} but this "
            f"node has {len(facts.gpus)} (0..{len(facts.gpus) - 1})",
            f"set {src} to ids from 0 to {len(facts.gpus) - 1}",
        )
    avail = len(chosen(ctx))
    if c.gpus and os.environ.get("CUDA_VISIBLE_DEVICES") not in (None, c.gpus):
        return result(
            id,
            title,
            "warn",
            f"cluster.gpus = {c.gpus!r} overrides "
            f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} of this "
            "shell",
            "unset one of them so the choice is explicit",
        )
    if c.nproc_per_node and c.nproc_per_node > avail:
        return result(
            id,
            title,
            "fail",
            f"{c.nproc_per_node} processes per node but only "
            f"{avail} GPU(s) chosen ({sel or 'all'})",
            f"set cluster.nproc_per_node = {avail} or choose more GPUs",
            {"cluster.nproc_per_node": avail} if avail else None,
        )
    if c.nproc_per_node and c.nproc_per_node < avail:
        return result(
            id,
            title,
            "warn",
            f"{avail} GPUs chosen but {c.nproc_per_node} "
            f"process(es): {avail - c.nproc_per_node} GPU(s) stay idle",
            f"set cluster.gpus to {c.nproc_per_node} ids or nproc_per_node = {avail}",
            {"cluster.nproc_per_node": avail},
        )
    return result(
        id, title, "pass", f"{avail} GPU(s) for {c.nproc_per_node or avail} process(es) per node"
    )


def check_gpu_uniform(ctx: Context) -> CheckResult:
    id, title = "gpu.uniform", "Chosen GPUs are the same model and memory"
    if (r := _skip_cpu(ctx, id, title)) or not (gs := chosen(ctx)):
        return r or result(id, title, "skip", "no GPU to compare")
    kinds = {(g.name, round(g.memory_total_gib)) for g in gs}
    if len(kinds) > 1:
        smallest = min(gs, key=lambda g: g.memory_total_gib)
        return result(
            id,
            title,
            "warn",
            "mixed GPUs: "
            + "; ".join(f"{g.index}: {g.name} {g.memory_total_gib:.0f} GiB" for g in gs),
            f"the slowest/smallest GPU ({smallest.index}) sets the pace and the batch size; "
            "choose identical GPUs with cluster.gpus",
        )
    name, mem = kinds.pop()
    return result(id, title, "pass", f"{len(gs)} × {name}, {mem} GiB")


def check_bf16(ctx: Context) -> CheckResult:
    id, title = "gpu.bf16", "bf16 support on every chosen GPU"
    if (r := _skip_cpu(ctx, id, title)) or not (gs := chosen(ctx)):
        return r or result(id, title, "skip", "no GPU to check")
    dtype = ctx.spec.model.dtype
    old = [g for g in gs if g.cc < (8, 0)]
    if not old:
        return result(id, title, "pass", "compute capability ≥ 8.0 on all: bf16 native")
    names = ", ".join(f"{g.index} ({g.name}, sm_{g.cc[0]}{g.cc[1]})" for g in old)
    if dtype == "bfloat16":
        return result(
            id,
            title,
            "fail",
            f"model.dtype = bfloat16 but {names} lack bf16",
            'set model.dtype = "float16" (or auto) or use Ampere or newer GPUs',
            {"model.dtype": "float16"},
        )
    return result(
        id,
        title,
        "warn",
        f"{names} lack bf16; dtype auto falls back to fp32",
        'model.dtype = "float16" halves memory on these GPUs',
        {"model.dtype": "float16"},
    )


def check_fp8(ctx: Context) -> CheckResult:
    id, title = "gpu.fp8", "fp8 units for method.fp8_base"
    spec = ctx.spec
    if not (
        traits_of(spec.backend).fp8_base and spec.method.type == "lora" and spec.method.fp8_base
    ):
        return result(id, title, "skip", "not applicable: method.fp8_base is off")
    if (r := _skip_cpu(ctx, id, title)) or not (gs := chosen(ctx)):
        return r or result(id, title, "skip", "no GPU to check")
    old = [g for g in gs if g.cc < FP8_MIN_CC]
    if not old:
        return result(id, title, "pass", "compute capability ≥ 8.9 on all: fp8 products")
    names = ", ".join(f"{g.index} ({g.name}, sm_{g.cc[0]}{g.cc[1]})" for g in old)
    return result(
        id,
        title,
        "fail",
        f"method.fp8_base needs compute capability 8.9 or newer "
        f"(L40S, H100, H200...); {names} lack fp8 matrix units",
        "set method.fp8_base = false (bf16 products)",
        {"method.fp8_base": False},
    )


def _torch_cuda() -> tuple[str, tuple[int, int] | None]:
    try:
        v = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "", None
    m = re.search(r"\+cu(\d+)(\d)$", v)
    return v, ((int(m.group(1)), int(m.group(2))) if m else None)


def check_driver(ctx: Context) -> CheckResult:
    id, title = "gpu.driver", "Driver supports the CUDA that torch was built for"
    if r := _skip_cpu(ctx, id, title):
        return r
    facts = ctx.gpus
    if not facts.gpus:
        return result(id, title, "skip", "no GPU driver found")
    tv, tcuda = _torch_cuda()
    if not tv:
        return result(id, title, "fail", "torch is not installed", "pip install tunedeck[train]")
    if tcuda is None:
        return result(
            id,
            title,
            "warn",
            f"torch {tv} has no +cuXYZ tag (CPU build?)",
            "install a CUDA build of torch",
        )
    drv = facts.cuda_driver
    detail = (
        (
            f"driver {facts.driver} supports CUDA {drv[0]}.{drv[1] if drv else '?'}; "
            f"torch {tv} needs CUDA {tcuda[0]}.{tcuda[1]}"
        )
        if drv
        else ""
    )
    if drv and drv[0] < tcuda[0]:
        return result(
            id,
            title,
            "fail",
            detail,
            f"upgrade the driver to one for CUDA "
            f"{tcuda[0]}.x, or install a torch build for CUDA {drv[0]}.x",
        )
    if drv and drv < tcuda:
        return result(
            id,
            title,
            "warn",
            detail + " (minor-version compatibility mode)",
            "newer kernels (PTX JIT) may fail; prefer a matching driver",
        )
    return result(id, title, "pass", detail or f"driver {facts.driver}")


def check_device_order(ctx: Context) -> CheckResult:
    id, title = "gpu.device_order", "CUDA_DEVICE_ORDER matches NVML numbering"
    if (r := _skip_cpu(ctx, id, title)) or not ctx.gpus.gpus:
        return r or result(id, title, "skip", "no GPU")
    order = ctx.spec.env.get("CUDA_DEVICE_ORDER") or os.environ.get("CUDA_DEVICE_ORDER", "")
    mixed = len({g.name for g in ctx.gpus.gpus}) > 1
    selecting = bool(ctx.spec.cluster.gpus or os.environ.get("CUDA_VISIBLE_DEVICES"))
    if order == "PCI_BUS_ID":
        return result(id, title, "pass", "CUDA_DEVICE_ORDER=PCI_BUS_ID (same ids as NVML)")
    if mixed and selecting:
        return result(
            id,
            title,
            "warn",
            "GPUs differ and CUDA orders them fastest-first by "
            "default, so CUDA_VISIBLE_DEVICES ids may not be the NVML ids shown here",
            'set env.CUDA_DEVICE_ORDER = "PCI_BUS_ID"',
            {"env.CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        )
    return result(
        id, title, "pass", f"CUDA_DEVICE_ORDER={order or 'unset'}; identical GPUs, ids agree"
    )


def nccl_version() -> str:
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def check_nccl(ctx: Context) -> CheckResult:
    id, title = "gpu.nccl", "NCCL available"
    if r := _skip_cpu(ctx, id, title):
        return r
    backend = ctx.resolved.cluster.dist_backend
    if backend != "nccl":
        return result(
            id,
            title,
            "warn",
            f"dist_backend = {backend} on GPUs (slow collectives)",
            'set cluster.dist_backend = "nccl" (or auto)',
            {"cluster.dist_backend": "nccl"},
        )
    v = nccl_version()
    if not v:
        return result(
            id,
            title,
            "warn",
            "no nvidia-nccl wheel found next to torch (a system NCCL may still be linked)",
            "check torch.cuda.nccl.version()",
        )
    return result(id, title, "pass", f"NCCL {v}")


def check_interconnect(ctx: Context) -> CheckResult:
    id, title = "gpu.interconnect", "GPU interconnect and peer-to-peer"
    if r := _skip_cpu(ctx, id, title):
        return r
    gs = chosen(ctx)
    if len(gs) < 2 or ctx.procs_per_node() < 2:
        return result(id, title, "skip", "one GPU per node: no peer traffic")
    ids = {g.index for g in gs}
    pairs = {k: v for k, v in ctx.gpus.links.items() if k[0] in ids and k[1] in ids}
    env = {**os.environ, **ctx.spec.env}
    p2p_off = env.get("NCCL_P2P_DISABLE", "0") not in ("0", "")
    broken = [k for k, (_, ok) in pairs.items() if not ok]
    kinds = sorted({link for link, _ in pairs.values()})
    detail = (
        ", ".join(
            f"{i}-{j}: {link}{'' if ok else ' (no P2P)'}"
            for (i, j), (link, ok) in sorted(pairs.items())
        )
        or "no topology data"
    )
    if broken and not p2p_off:
        return result(
            id,
            title,
            "warn",
            detail + "; NCCL may hang on P2P between these",
            'if the first all-reduce hangs, set env.NCCL_P2P_DISABLE = "1" '
            "(or enable IOMMU passthrough / ACS off in the BIOS)",
            {"env.NCCL_P2P_DISABLE": "1"},
        )
    if p2p_off and not broken:
        # only the spec's own variable can be removed by a fix; the shell's stays the user's
        unset = {"env.NCCL_P2P_DISABLE": None} if "NCCL_P2P_DISABLE" in ctx.spec.env else None
        return result(
            id,
            title,
            "warn",
            detail + "; NCCL_P2P_DISABLE is set although P2P works",
            "remove NCCL_P2P_DISABLE: it forces copies through host memory",
            unset,
        )
    if "across CPU sockets" in kinds:
        return result(
            id,
            title,
            "warn",
            detail,
            "pick GPUs on one socket (cluster.gpus) for faster all-reduce",
        )
    return result(id, title, "pass", detail)


CHECKS = [
    check_gpu_count,
    check_gpu_uniform,
    check_bf16,
    check_fp8,
    check_driver,
    check_device_order,
    check_nccl,
    check_interconnect,
]
