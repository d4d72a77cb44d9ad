"""`tunedeck export-model RUN [--checkpoint N|best|last] [--no-merge] [--dtype bf16] [-o DIR]`:
a checkpoint as a folder transformers loads (an adapter merged into its base by default), with
its tokenizer, chat template and a model card naming the run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunedeck.core.api import clean, export_model, find_run, pick_checkpoint, print_json


def register(sub) -> None:
    s = sub.add_parser("export-model", help="merge a run's adapter into its base and save it")
    s.add_argument("run", help="run id, unique prefix, or name")
    s.add_argument("--checkpoint", default="last", metavar="N|best|last")
    s.add_argument(
        "--merge",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="merge an adapter into the base (--no-merge: the adapter alone)",
    )
    s.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    s.add_argument("-o", "--output", help="new folder (default: <run dir>/exports/...)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_export_model)


def cmd_export_model(args) -> int:
    run = find_run(args.run)
    src = pick_checkpoint(run.run_dir, args.checkpoint)
    kind = "merged" if args.merge and src.adapter else "adapter" if src.adapter else "full"
    out = (
        Path(args.output)
        if args.output
        else (run.run_dir / "exports" / f"step{src.step}-{kind}-{args.dtype}")
    )

    def progress(msg: str) -> None:
        print(clean(msg), file=sys.stderr, flush=True)

    path = export_model(src, out, merge=args.merge, dtype=args.dtype, progress=progress)
    if args.json:
        print_json({"run_id": run.run_id, "step": src.step, "kind": kind, "path": str(path)})
    else:
        print(clean(str(path)))
    return 0
