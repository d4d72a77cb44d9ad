"""`tunedeck import 'COMMAND' [-o FILE]`, `tunedeck export SPEC --format ...` and `tunedeck
export RUN --format vllm` (what a run trained: its merged export, else base + adapter)."""

from __future__ import annotations

import sys
from pathlib import Path

from tunedeck.cli.common import add_set
from tunedeck.core.api import (
    CommandImportError,
    ExportError,
    EXPORT_FORMATS,
    FlagTableError,
    RunNotFound,
    clean,
    export,
    find_run,
    import_command,
    rescale_grad_accum,
    resolve,
    vllm_for_run,
)
from tunedeck.core.spec import SpecError, load_spec


def cmd_import(args) -> int:
    try:
        result = import_command(args.command)
    except CommandImportError as e:
        print(f"tunedeck import: {e}", file=sys.stderr)
        return 2
    for w in result.warnings:
        print(f"warning: {clean(w)}", file=sys.stderr)
    text = result.to_toml()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_export(args) -> int:
    if args.format == "vllm" and not Path(args.spec).is_file():
        try:
            text = vllm_for_run(find_run(args.spec).run_dir)
        except (RunNotFound, ExportError, SpecError) as e:
            print(f"tunedeck export: {e}", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    try:
        spec = resolve(load_spec(args.spec, args.set))
        if args.world:
            r = rescale_grad_accum(spec, args.world)
            print(f"# {r.note}", file=sys.stderr)
            spec = r.spec
        text = export(spec, args.format)
    except (SpecError, ExportError, FlagTableError, ValueError) as e:
        print(f"tunedeck export: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def register(sub) -> None:
    s = sub.add_parser(
        "import",
        help="turn a pasted swift/megatron/llamafactory-cli/torchrun command into a spec file",
    )
    s.add_argument("command", help="the whole command line, quoted as one argument")
    s.add_argument("-o", "--output", help="write the spec here (default: stdout)")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser(
        "export",
        help="print a spec as a launch script, its backend's own command (swift, "
        "llamafactory), per-node commands, Slurm script or vLLM serve command",
    )
    s.add_argument("spec", help="spec or preset TOML (with --format vllm, also a run)")
    s.add_argument("--format", default="sh", choices=EXPORT_FORMATS)
    add_set(s)
    s.add_argument(
        "--world",
        type=int,
        metavar="N",
        help="export for N ranks, rescaling train.grad_accum so the effective batch stays the same",
    )
    s.set_defaults(func=cmd_export)
