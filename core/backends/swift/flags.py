"""ms-swift flag tables (from the installed version, cached) and the fixes for flags that do not
exist: blog recipes, 2.x/3.x names, Megatron-LM names (research: ms-swift.md section 2.2).

`validate(command, argv)` is what the swift backend runs before every launch: an unknown flag
would make ms-swift abort with `ValueError: remaining_argv` minutes later, after model load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.paths import cache_dir
from tunedeck.core.backends.swift.version import installed_version, parse


@dataclass(frozen=True)
class Fix:
    """What an old or invented flag became. `flag` empty = removed with no replacement
    (old values such as --train_type qlora: VALUE_FIXES)."""

    flag: str
    why: str
    value_map: tuple[tuple[str, str], ...] = ()


_QLORA = ("--quant_method", "bnb", "--quant_bits", "4")

# Old name -> 4.x name. The same table answers `tunedeck import` and backend refusals.
FIXES_4X: dict[str, Fix] = {
    "train_type": Fix("tuner_type", "renamed in ms-swift 4.0; 4.1+ rejects --train_type"),
    "sft_type": Fix("tuner_type", "2.x name"),
    "model_id_or_path": Fix("model", "2.x name"),
    "dtype": Fix(
        "torch_dtype",
        "2.x name",
        value_map=(("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")),
    ),
    "lora_target_modules": Fix(
        "target_modules", "2.x name", value_map=(("ALL", "all-linear"), ("DEFAULT", "all-linear"))
    ),
    "use_flash_attn": Fix(
        "attn_impl",
        "2.x name",
        value_map=(
            ("true", "flash_attn"),
            ("True", "flash_attn"),
            ("false", "sdpa"),
            ("False", "sdpa"),
        ),
    ),
    "batch_size": Fix("per_device_train_batch_size", "2.x name"),
    "dataset_test_ratio": Fix("split_dataset_ratio", "2.x name"),
    "sp_size": Fix(
        "sequence_parallel_size", "never existed; the Ulysses/ring size is --sequence_parallel_size"
    ),
    "tp_size": Fix("tensor_model_parallel_size", "Megatron-SWIFT has no --tp_size"),
    "pp_size": Fix("pipeline_model_parallel_size", "Megatron-SWIFT has no --pp_size"),
    "cp_size": Fix("context_parallel_size", "Megatron-SWIFT has no --cp_size"),
    "ep_size": Fix("expert_model_parallel_size", "Megatron-SWIFT has no --ep_size"),
    "tensor_parallel_size": Fix(
        "vllm_tensor_parallel_size", "vLLM flags are prefixed vllm_ since 3.5"
    ),
    "gpu_memory_utilization": Fix(
        "vllm_gpu_memory_utilization", "vLLM flags are prefixed vllm_ since 3.5"
    ),
    "vllm_device": Fix("", "removed in 3.x GRPO; use --use_vllm true --vllm_mode colocate|server"),
    "num_infer_workers": Fix(
        "", "removed in 3.x GRPO; use --use_vllm true --vllm_mode colocate|server"
    ),
    "fsdp_transformer_layer_cls_to_wrap": Fix(
        "", "gone in transformers 5; --fsdp fsdp2 wraps decoder layers itself"
    ),
    # Megatron 3.x (Megatron-LM) names
    "load": Fix("mcore_model", "Megatron 3.x name"),
    "save": Fix("output_dir", "Megatron 3.x name"),
    "log_interval": Fix("logging_steps", "Megatron 3.x name"),
    "save_interval": Fix("save_steps", "Megatron 3.x name"),
    "eval_interval": Fix("eval_steps", "Megatron 3.x name"),
    "max_epochs": Fix("num_train_epochs", "Megatron 3.x name (swift sft still has --max_epochs)"),
    "num_workers": Fix("dataloader_num_workers", "Megatron 3.x name"),
}
# Values that are wrong even under the right flag name.
VALUE_FIXES: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "tuner_type": {
        "qlora": (
            ("--tuner_type", "lora", *_QLORA),
            "ms-swift has no qlora tuner: QLoRA is lora on a bnb 4-bit base",
        )
    },
    "deepspeed": {
        f"default-zero{i}": (("--deepspeed", f"zero{i}"), "2.x preset name") for i in range(4)
    },
    "fsdp": {
        "full_shard auto_wrap": (
            ("--fsdp", "fsdp2"),
            "ms-swift reads --fsdp as a preset name or JSON, not the HF strategy string",
        )
    },
}
# 3.x took the old names; the newer ones are refused there.
FIXES_3X: dict[str, Fix] = {"tuner_type": Fix("train_type", "ms-swift 3.x name")}


def fixes_for(version: str) -> dict[str, Fix]:
    return FIXES_4X if parse(version) >= (4, 0, 0) else FIXES_3X


# -- flag tables -------------------------------------------------------------------------


class FlagTableError(RuntimeError):
    pass


def _versions() -> tuple[str, str]:
    import importlib.metadata as md

    def v(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "none"

    # HF TrainingArguments fields are part of the table, so transformers counts too
    return v("ms-swift"), v("transformers")


def _cache_key() -> str:
    swift, tf = _versions()
    return f"swift{swift}-tf{tf}-py{sys.version_info[0]}{sys.version_info[1]}"


# Tables shipped with tunedeck for the ms-swift/transformers pairs it pins, so the first
# `tunedeck import` does not spend 6 s of CPU importing ms-swift (torch, transformers) to
# read them; tests/test_swift_tables.py checks each against the installed ms-swift.
# Regenerate with `python -m tunedeck.core.backends.swift.flags --ship`.
SHIPPED = Path(__file__).resolve().parent / "tables"
TABLE_FORMAT = "v2"  # v2: defaults, types and dests in every flag's entry


def shipped_path() -> Path:
    swift, tf = _versions()
    return SHIPPED / f"flags-{TABLE_FORMAT}-swift{swift}-tf{tf}.json.gz"


def cache_path() -> Path:
    """The per-user table cache: shared by every TUNEDECK_HOME (it depends only on the
    installed versions); TUNEDECK_CACHE moves it, as it moves every built asset."""
    import os as _os

    root = (
        Path(_os.environ["TUNEDECK_CACHE"]).expanduser()
        if _os.environ.get("TUNEDECK_CACHE")
        else Path(_os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
        / "tunedeck"
    )
    return root / "swift" / f"flags-{TABLE_FORMAT}-{_cache_key()}.json"


_TABLES: dict | None = None


def flag_tables() -> dict | None:
    """{"version": ..., "commands": {command: {flag: info}}} of the installed ms-swift, or None
    when it is not installed. Read from the shipped table for this version pair, else from the
    per-user cache, else built once (a child process imports ms-swift) and cached."""
    global _TABLES
    if _TABLES is not None:
        return _TABLES
    if installed_version() is None:
        return None
    shipped = shipped_path()
    if shipped.exists():
        import gzip

        try:
            _TABLES = json.loads(gzip.decompress(shipped.read_bytes()))
            return _TABLES
        except (OSError, ValueError):
            pass
    path = cache_path()
    try:
        _TABLES = json.loads(path.read_text(encoding="utf-8"))
        return _TABLES
    except (OSError, ValueError):
        pass
    data = run_check(["--table"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    _TABLES = data
    return data


def ship_table() -> Path:
    """Write the installed ms-swift's table into the package (a maintainer's step)."""
    import gzip

    data = run_check(["--table"])
    out = shipped_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    return out


def run_check(args: list[str], stdin: str | None = None, timeout: float = 180) -> object:
    """Run tunedeck.core.backends.swift.check in a child interpreter and return its JSON answer."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # a folder of tunedeck's own as the working directory: `-m` puts it first on sys.path, and
    # a user's folder may hold a `swift/` that would shadow ms-swift
    cwd = cache_dir()
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.core.backends.swift.check", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(cwd),
    )
    out = proc.stdout.rpartition("@@TUNEDECK@@")[2]
    if proc.returncode != 0 or not out:
        raise FlagTableError(
            f"could not read ms-swift's arguments (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}"
        )
    return json.loads(out)


def parser_check(jobs: list[tuple[str, list[str]]], values: bool = False) -> list[dict]:
    """ms-swift's own HfArgumentParser on each (command, argv), in one child process:
    remaining argv and errors, and with `values` every field as parsed."""
    return run_check(
        ["--parse" if values else "--check"],  # type: ignore[return-value]
        stdin=json.dumps(jobs),
    )


# -- validation --------------------------------------------------------------------------


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[("--flag", [values...]), ...]; a value never starts with `--` (negative numbers are
    values). Words before the first flag come back under the flag ""."""
    out: list[tuple[str, list[str]]] = []
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, val = word.partition("=")
            out.append((name, [val] if eq else []))
        elif out:
            out[-1][1].append(word)
        else:
            out.append(("", [word]))
    return out


def suggest(name: str, known: dict, version: str) -> str:
    """The message for a flag the installed ms-swift does not know."""
    fix = fixes_for(version).get(name)
    if fix is not None:
        if fix.flag and fix.flag in known:
            return f"--{name} does not exist in ms-swift {version}: use --{fix.flag} ({fix.why})"
        if not fix.flag:
            return f"--{name} does not exist in ms-swift {version}: {fix.why}"
    longer = sorted(k for k in known if k.startswith(name) and "-" not in k)
    if longer:
        return (
            f"--{name} is not an ms-swift {version} flag (argparse would silently take it "
            f"as --{longer[0]}); write --{longer[0]}"
        )
    import difflib

    close = difflib.get_close_matches(name, [k for k in known if "-" not in k], n=1)
    hint = f"; did you mean --{close[0]}?" if close else ""
    return f"--{name} does not exist in ms-swift {version}{hint}"


def validate(command: str, argv: list[str]) -> list[str]:
    """Problems with an ms-swift argv (flags after the module), checked against the installed
    version's own flag table: unknown names, abbreviations, values outside a flag's choices,
    known-wrong values. Empty when ms-swift is not installed (nothing to check against)."""
    tables = flag_tables()
    if tables is None or command not in tables["commands"]:
        return []
    known = tables["commands"][command]
    version = tables["version"]
    problems = []
    for flag, values in split_flags(argv):
        if not flag:
            problems.append(f"stray value(s) {values} before the first flag")
            continue
        name = flag[2:]
        info = known.get(name)
        if info is None:
            problems.append(suggest(name, known, version))
            continue
        canon = name.replace("-", "_")
        for v in values:
            bad = VALUE_FIXES.get(canon, {}).get(v)
            if bad:
                problems.append(f"--{name} {v}: {bad[1]}; use {' '.join(bad[0])}")
            elif info.get("choices") and v not in info["choices"]:
                problems.append(f"--{name} {v}: must be one of {', '.join(info['choices'])}")
        if info.get("nargs") is None and not info.get("bool") and len(values) > 1:
            problems.append(f"--{name} takes one value, got {values}")
    return problems


if __name__ == "__main__":
    if sys.argv[1:] == ["--ship"]:
        print(ship_table())
    else:
        print("usage: python -m tunedeck.core.backends.swift.flags --ship", file=sys.stderr)
        sys.exit(2)
