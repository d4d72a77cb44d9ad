"""`tunedeck estimate SPEC`: memory per GPU with a breakdown, throughput/ETA and the advice,
rendered from what core.api returns (the compose form's ctrl+t asks the same `advice_for`)."""

from __future__ import annotations

import json
import sys

from tunedeck.cli.common import add_set
from tunedeck.core import api


def register(sub) -> None:
    s = sub.add_parser("estimate", help="memory per GPU, throughput and a strategy advice")
    s.add_argument("spec", help="spec file")
    add_set(s)
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
    from tunedeck.core.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec, args.set)
        # the run it starts: ms-swift's defaults where an ms-swift spec sets nothing
        est = api.estimate_run(
            spec, gpus=args.gpus, gpu_name=args.gpu_name, gpu_mem_gib=args.gpu_mem, mfu=args.mfu
        )
    except (SpecError, api.ArchError) as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 2
    out = est.to_json()
    length = api.length_unless_steps(spec)
    if length and "throughput" in out:  # the steps, so the ETA, would be tunedeck's default
        out["throughput"].update(eta=None, eta_s=None)
    out["length"] = length or f"{spec.train.max_steps} steps"
    mem_cap = est.gpu_mem_gib or args.gpu_mem or 80.0
    n_gpus = args.gpus or (
        est.inputs.world_size // spec.cluster.nnodes if est.inputs.device == "cuda" else 1
    )
    advice, rows, tokens = api.advice_for(est, spec, gpus=n_gpus, gpu_mem_gib=mem_cap)
    out["advice"] = advice.to_json()
    out["advice"]["per_gpu_gib"] = round(advice.per_gpu_gib, 2)
    out["data"] = {"rows": rows, "approx_tokens": tokens}
    if args.json:
        api.print_json(out)
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
    for line in api.speed_flag_lines(advice):
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
