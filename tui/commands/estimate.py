"""`tunedeck estimate SPEC`: memory per GPU with a breakdown, throughput/ETA and the advice."""

from __future__ import annotations

import json
import sys

from tunedeck.tui.format import print_json


def register(sub) -> None:
    s = sub.add_parser("estimate", help="memory per GPU, throughput and a strategy advice")
    s.add_argument("spec", help="spec file")
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key (repeatable)",
    )
    s.add_argument(
        "--gpus",
        type=int,
        help="plan for this many GPUs per node (default: the spec resolved on this node)",
    )
    s.add_argument(
        "--gpu-mem",
        type=float,
        metavar="GIB",
        help="memory per GPU (default: this node's, else 80)",
    )
    s.add_argument("--gpu-name", default="", help="GPU model for the throughput peak, e.g. H100")
    s.add_argument(
        "--mfu",
        type=float,
        default=None,
        help="assumed model FLOPs utilisation (default: what the spec's backend "
        "and switches were measured at)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    from tunedeck.core.estimate import ArchError
    from tunedeck.core.spec import SpecError, load_spec
    from tunedeck.core.backends.run_estimate import estimate_run, length_unless_steps

    try:
        spec = load_spec(args.spec, args.set)
        # the run it starts: ms-swift's defaults where an ms-swift spec sets nothing
        est = estimate_run(
            spec, gpus=args.gpus, gpu_name=args.gpu_name, gpu_mem_gib=args.gpu_mem, mfu=args.mfu
        )
    except (SpecError, ArchError) as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 2
    out = est.to_json()
    length = length_unless_steps(spec)
    if length and "throughput" in out:  # the steps, so the ETA, would be tunedeck's default
        out["throughput"].update(eta=None, eta_s=None)
    out["length"] = length or f"{spec.train.max_steps} steps"
    mem_cap = est.gpu_mem_gib or args.gpu_mem or 80.0
    n_gpus = args.gpus or (
        est.inputs.world_size // spec.cluster.nnodes if est.inputs.device == "cuda" else 1
    )
    advice, rows, tokens = advice_for(est, spec, gpus=n_gpus, gpu_mem_gib=mem_cap)
    out["advice"] = advice.to_json()
    out["advice"]["per_gpu_gib"] = round(advice.per_gpu_gib, 2)
    out["data"] = {"rows": rows, "approx_tokens": tokens}
    if args.json:
        print_json(out)
        return 0
    i = est.inputs
    unit = "GPU" if i.device == "cuda" else "process (CPU)"
    print(
        f"model     {i.arch.model_type} {est.memory.params / 1e9:.3g}B params, "
        f"{est.memory.trainable_params / 1e6:.3g}M trainable ({i.method})"
    )
    print(
        f"setup     {i.strategy}"
        + (f" ZeRO-{i.zero_stage}" if i.strategy == "deepspeed" else "")
        + (f" offload {i.offload}" if i.offload != "none" else "")
        + f", {i.world_size} rank(s), micro-batch {i.micro_batch} × {i.seq_len} tokens, "
        f"gradient checkpointing {'on' if i.gradient_checkpointing else 'off'}"
    )
    print(
        f"\nper {unit}: {out['per_gpu_gib']:.1f} GiB  (torch reserved "
        f"{out['reserved_gib']:.1f}, allocated {out['allocated_gib']:.1f}; peak at "
        f"{out['peak_phase']})"
    )
    for k, v in out["breakdown"].items():
        print(f"  {k.replace('_', ' '):<20} {v:8.2f} GiB")
    for n in out["notes"]:
        print(f"  note: {n}")
    print(f"\neffective batch {out['effective_batch']}")
    if est.throughput:
        t = est.throughput
        length = length or f"{spec.train.max_steps} steps ≈ {out['throughput']['eta']}"
        print(
            f"throughput ≈ {t.tokens_per_s_per_gpu:,.0f} tok/s per GPU ({est.gpu_name}, "
            f"MFU {t.mfu:.0%}); {length}"
        )
    print(
        f"\nadvice: {advice.strategy} on {advice.gpus} GPU(s)"
        + (", gradient checkpointing" if advice.gradient_checkpointing else "")
        + (", CPU offload" if advice.offload else "")
    )
    for r in advice.reasons:
        print(f"  - {r}")
    for line in speed_flag_lines(advice):
        print("  " + line)
    if advice.overrides:
        print(
            "  apply: "
            + " ".join(
                f"--set {k}={json.dumps(v) if isinstance(v, str) else str(v).lower()}"
                for k, v in advice.overrides.items()
            )
        )
    return 0


def advice_for(est, spec, *, gpus: int, gpu_mem_gib: float) -> tuple:
    """(Advice, data rows, approximate data tokens) for an `estimate_run` of `spec`: the one
    question `tunedeck estimate` and the compose form's ctrl+t both ask (the data counted at
    the run's own length, the installed ms-swift's speed flags). Reads files: not on the UI
    thread."""
    from tunedeck.core.estimate import peak_tflops
    from tunedeck.core.estimate.advisor import advise, dataset_tokens
    from tunedeck.core.estimate.speed import builtin_speed_flags

    run = est.spec or spec
    rows, tokens = dataset_tokens(run.data.path, run.data.max_length) if run.data.path else (0, 0)
    advice = advise(
        est.inputs,
        gpus=max(gpus, 1),
        gpu_mem_gib=gpu_mem_gib,
        data_tokens=tokens,
        peak_tflops=peak_tflops(est.gpu_name) or 989.0,
        backend=spec.backend,
        speed_flags=_swift_speed_flags(spec)
        + (builtin_speed_flags(run, est.gpu_name) if est.throughput else []),
        mfu=est.throughput.mfu if est.throughput else None,
    )
    return advice, rows, tokens


def speed_flag_lines(advice) -> list[str]:
    """The advice's speed switches as lines, under their heading ([] when none): ms-swift
    flags as they go on its command line, built-in spec keys as `--set` overrides."""
    if not advice.speed_flags:
        return []
    swift = advice.speed_flags[0]["flag"].startswith("--")
    return [
        f"faster with {'the installed ms-swift' if swift else 'the built-in trainer'} "
        "(measured on one H200):"
    ] + [f"  {_switch(f)}  ~{f['gain']:.2f}x: {f['why']}" for f in advice.speed_flags]


def _switch(flag: dict) -> str:
    """An ms-swift flag as on its command line; a built-in spec key as a --set override."""
    if flag["flag"].startswith("--"):
        return f"{flag['flag']} {flag['value']}"
    return f"--set {flag['flag']}={flag['value']}"


def _swift_speed_flags(spec) -> list[dict]:
    """ms-swift switches this run does not use yet and the installed ms-swift has."""
    if spec.backend != "swift" or spec.swift.command.startswith("megatron"):
        return []
    from tunedeck.core.backends.swift import swift_args
    from tunedeck.core.backends.swift.flags import FlagTableError
    from tunedeck.core.backends.swift.speed import speed_flags

    try:
        return speed_flags(swift_args(spec, None), spec.swift.command)
    except (ValueError, FlagTableError):  # a spec the plan refuses gets no advice here
        return []
