"""Entry point for torchrun: python -m torch.distributed.run ... -m tunedeck.core.train --run-dir DIR."""

import argparse
import sys

from tunedeck.core.train.trainer import main


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tunedeck.core.train",
        description="tunedeck built-in trainer (one torchrun worker)",
    )
    ap.add_argument("--run-dir", required=True, help="run directory holding spec.toml")
    args = ap.parse_args(argv)
    return main(args.run_dir)


if __name__ == "__main__":
    sys.exit(cli())
