"""The keys the LLaMA-Factory behind llamafactory.python accepts (its train argument
dataclasses' fields), read once per interpreter and version by a child process of that
interpreter and cached under tunedeck's cache, so check() names an unknown settings key before
launch instead of a rank failing on "Some keys are not used by the HfArgumentParser"."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from tunedeck.core.paths import cache_dir

VERSION = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('llamafactory'))\n"
    "except m.PackageNotFoundError:\n    print('none')\n"
)
FIELDS = (
    "import dataclasses, json\n"
    "from llamafactory.hparams.parser import _TRAIN_ARGS\n"
    "print(json.dumps(sorted({f.name for c in _TRAIN_ARGS for f in dataclasses.fields(c)})))\n"
)


class FieldTableError(ValueError):
    pass


def _run(python: str, code: str, timeout: float) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cache_dir() if cache_dir().is_dir() else None,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FieldTableError(f"llamafactory.python: {python} did not answer ({e})") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FieldTableError(f"llamafactory.python: {python} cannot import llamafactory: {last}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def cache_path(python: str, version: str) -> Path:
    tag = hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:12]
    return cache_dir() / "llamafactory" / f"fields-{version}-{tag}.json"


_MEMO: dict[str, frozenset[str]] = {}


def field_names(python: str, timeout: float = 300) -> frozenset[str]:
    """Every key LLaMA-Factory's train parser takes under `python`; raises FieldTableError
    naming llamafactory.python when that interpreter has no usable llamafactory."""
    if python in _MEMO:
        return _MEMO[python]
    version = _run(python, VERSION, 60)
    if version in ("", "none"):
        raise FieldTableError(f"llamafactory.python: {python} has no llamafactory installed")
    path = cache_path(python, version)
    try:
        names = frozenset(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        names = frozenset(json.loads(_run(python, FIELDS, timeout)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted(names)), encoding="utf-8")
        os.replace(tmp, path)
    _MEMO[python] = names
    return names
