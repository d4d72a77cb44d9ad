"""A Python with LLaMA-Factory for the tests (docs/llamafactory.md says why it needs its own).

`build(folder)` makes a venv in `folder` that reuses the running interpreter's torch (and every
other package LLaMA-Factory does not pin) through a .pth file, installs LLaMA-Factory and the
releases it pins beside it, and stubs torchaudio (no wheel matches tunedeck's torch; text
training never calls it). `python tests/lf_env.py FOLDER` builds one by hand.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

LLAMAFACTORY = "llamafactory==0.9.5"
# with --no-deps: LLaMA-Factory itself and torchdata (whose own torch pin would fetch a torch)
NO_DEPS = [LLAMAFACTORY, "torchdata==0.11.0"]
# the releases LLaMA-Factory 0.9.5 pins (its wheel's metadata) and the modules it imports
PINNED = [
    "transformers==5.6.0",
    "peft==0.18.1",
    "datasets==4.0.0",
    "accelerate==1.11.0",
    "trl==0.24.0",
    "tyro<0.9.0",
    "einops",
    "fire",
    "omegaconf",
    "pyyaml",
    "sentencepiece",
    "tiktoken",
    "pandas",
    "scipy",
    "matplotlib>=3.7",
    "protobuf",
    "pydantic",
    "safetensors",
    "numpy",
    "packaging",
    "modelscope",
    "hf-transfer",
    "av<=16.0.0",
    "fastapi",
    "uvicorn",
    "sse-starlette",
]
TORCHAUDIO_STUB = '''"""Stub: no torchaudio wheel matches the shared torch; LLaMA-Factory imports it
unconditionally (data/mm_plugin.py) but text-only training never calls it."""
__version__ = "0.0.0+stub"


def __getattr__(name):
    raise ImportError(f"torchaudio stub: torchaudio.{name} is not available in this venv")
'''


class BuildError(RuntimeError):
    """pip or venv failed; the message is the tail of what it printed."""


def _run(argv: list[str], timeout: float) -> None:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise BuildError(f"{' '.join(argv[:4])} ...: " + " | ".join(tail))


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def build(folder: Path, timeout: float = 1800) -> tuple[Path, float]:
    """(the venv's python, seconds the build took: 0 when `folder` held a finished one).
    Several processes may ask at once: one builds, the others wait on the lock."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / ".built"
        shared = sysconfig.get_paths()["purelib"]
        # a venv built beside another interpreter (an older clone's, maybe deleted since)
        # would see that one's packages, or none: built again for this one
        stamp = f"{LLAMAFACTORY}\n{shared}\n"
        if done.is_file() and done.read_text() == stamp:
            return python_of(folder), 0.0
        t0 = time.monotonic()
        _run([sys.executable, "-m", "venv", "--clear", str(folder)], 300)
        py = str(python_of(folder))
        site = Path(
            subprocess.check_output(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                text=True,
            ).strip()
        )
        # first, so pip counts the shared torch as installed and never fetches another
        (site / "zz_tunedeck_shared.pth").write_text(shared + "\n")
        pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, "--no-deps", *NO_DEPS], timeout)
        _run([*pip, *PINNED], timeout)
        (site / "torchaudio").mkdir(exist_ok=True)
        (site / "torchaudio" / "__init__.py").write_text(TORCHAUDIO_STUB)
        _run([py, "-c", "import llamafactory.hparams.parser"], 300)
        done.write_text(stamp)
        return python_of(folder), time.monotonic() - t0


if __name__ == "__main__":
    python, took = build(Path(sys.argv[1]).resolve())
    print(f"{python} ({took:.0f} s)")
