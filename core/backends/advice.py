"""The estimate's advice for a spec: the one question `tunedeck estimate` and the compose
form's ctrl+t both ask, answered here so the front ends only render it."""

from __future__ import annotations

from tunedeck.core.backends import backend_of
from tunedeck.core.estimate import peak_tflops
from tunedeck.core.estimate.advisor import advise, dataset_tokens
from tunedeck.core.estimate.speed import builtin_speed_flags


def advice_for(est, spec, *, gpus: int, gpu_mem_gib: float) -> tuple:
    """(Advice, data rows, approximate data tokens) for an `estimate_run` of `spec`: the data
    counted at the run's own length, the backend's speed switches. Reads files: not on the UI
    thread."""
    run = est.spec or spec
    rows, tokens = dataset_tokens(run.data.path, run.data.max_length) if run.data.path else (0, 0)
    advice = advise(
        est.inputs,
        gpus=max(gpus, 1),
        gpu_mem_gib=gpu_mem_gib,
        data_tokens=tokens,
        peak_tflops=peak_tflops(est.gpu_name) or 989.0,
        backend=spec.backend,
        speed_flags=backend_of(spec).speed_flags(spec)
        + (builtin_speed_flags(run, est.gpu_name) if est.throughput else []),
        mfu=est.throughput.gemm_mfu if est.throughput else None,
        gpu_name=est.gpu_name,
    )
    return advice, rows, tokens


def speed_flag_lines(advice) -> list[str]:
    """The advice's speed switches as lines, under their heading ([] when none): a backend's
    flags as they go on its command line, built-in spec keys as `--set` overrides."""
    if not advice.speed_flags:
        return []
    flags = advice.speed_flags[0]["flag"].startswith("--")
    return [
        f"faster with {'the installed ms-swift' if flags else 'the built-in trainer'} "
        "(measured on one H200):"
    ] + [f"  {_switch(f)}  ~{f['gain']:.2f}x: {f['why']}" for f in advice.speed_flags]


def _switch(flag: dict) -> str:
    """A trainer's flag as on its command line; a built-in spec key as a --set override."""
    if flag["flag"].startswith("--"):
        return f"{flag['flag']} {flag['value']}"
    return f"--set {flag['flag']}={flag['value']}"
