"""`tunedeck import` of LLaMA-Factory commands: `[VAR=..] llamafactory-cli train x.yaml
[key=value ...]` (also `lmf`, `python -m llamafactory.cli`), `llamafactory-cli train --key
value ...` (its argparse form, without a file), and launchers running its launcher module
(`torchrun ... -m llamafactory.launcher x.yaml`). The LLaMA-Factory backend's `Importer`.

The words are read as LLaMA-Factory's own parser reads them (llamafactory/hparams/parser.py
`read_args`): after a .yaml/.yml/.json file, OmegaConf `key=value` overrides that win over
it; without one, `--key value` flags. Keys become spec keys through config.KEYS
(yaml_io.config_values); the rest stay in llamafactory.settings, which the backend's check
holds against the installed LLaMA-Factory's parser before a launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunedeck.core.backends.importing import (
    Cluster,
    CommandImportError,
    Env,
    Imported,
    Importer,
    read_config,
    set_key,
)
from tunedeck.core.backends.llamafactory.config import parse_scalar
from tunedeck.core.backends.llamafactory.yaml_io import LAUNCHERS, config_values
from tunedeck.core.spec import MASK

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def command(out: Imported, prog: str, rest: list[str], cluster: Cluster, env: Env) -> None:
    if rest[:1] != ["train"]:
        raise CommandImportError(
            f"`{prog} {' '.join(rest[:1])}`: tunedeck imports `{prog} train` (training runs)"
        )
    if env.pop("FORCE_TORCHRUN", None) is not None:
        out.notes.append("FORCE_TORCHRUN: tunedeck always starts the ranks with torchrun")
    if "nproc_per_node" not in cluster:
        # llamafactory-cli starts one rank per visible GPU unless NPROC_PER_NODE says
        cluster["nproc_per_node"] = 0
        out.notes.append(
            "NPROC_PER_NODE is unset, so llamafactory-cli runs one rank per visible GPU; "
            "so does the spec (cluster.nproc_per_node = 0)"
        )
    _read(out, rest[1:], prog)


def target(
    out: Imported, module: str, words: list[str], cluster: Cluster, env: Env, launcher: str
) -> bool:
    """LLaMA-Factory's launcher module or file run by torchrun (what llamafactory-cli starts)."""
    if module == "llamafactory.launcher":
        _read(out, words, f"{launcher} -m {module}")
        return True
    if not module and words and words[0].endswith("llamafactory/launcher.py"):
        _read(out, words[1:], f"{launcher} {words[0]}")
        return True
    return False


def _read(out: Imported, words: list[str], what: str) -> None:
    cfg: dict[str, Any] = {}
    if words and words[0].endswith(CONFIG_SUFFIXES):
        path = words.pop(0)
        cfg = read_config(path, "LLaMA-Factory config")
        out.raw["name"] = Path(path).stem
        for w in words:
            key, eq, value = w.partition("=")
            if w.startswith("-") or not eq or not key:
                raise CommandImportError(
                    f"{w}: after a config file LLaMA-Factory takes overrides as key=value"
                )
            cfg[key] = _value(value)
        out.notes.append(f"{path}: read; key=value words after it win, as in LLaMA-Factory")
    else:
        cfg = _flags(words, what)
    for key, value in list(cfg.items()):
        if value == MASK:
            out.warnings.append(
                f"{key} {MASK} is a masked value from a tunedeck file, not the real one; left out"
            )
            del cfg[key]
    try:
        values, warnings = config_values(cfg)
    except (TypeError, ValueError) as e:
        raise CommandImportError(f"{what}: {e}") from None
    out.warnings += warnings
    for key, value in values.items():
        if "." in key:
            set_key(out.raw, key, value)
        else:
            out.raw[key] = value
    kept = [w.partition("=")[0] for w in values.get("llamafactory.settings", [])]
    if kept:
        out.notes.append(
            f"kept as written in llamafactory.settings: {', '.join(kept)} (the backend checks "
            "them against the installed LLaMA-Factory before a launch)"
        )
    if "model.path" not in values:
        raise CommandImportError(f"{what}: no model_name_or_path")


def _value(text: str) -> Any:
    """An override's value as OmegaConf reads `key=value` (YAML scalars; 2e-4 a number)."""
    return parse_scalar(text) if text else ""


def _flags(words: list[str], what: str) -> dict[str, Any]:
    """`--key value`, `--key=value` and a bare `--flag` (true), as HfArgumentParser takes them."""
    if words and not words[0].startswith("--"):
        raise CommandImportError(
            f"{what} {words[0]}: expected a .yaml/.yml/.json config or --key value flags"
        )
    cfg: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--") or len(w) < 3:
            raise CommandImportError(f"{w}: expected --key value")
        key, eq, value = w[2:].partition("=")
        key = key.replace("-", "_")  # argparse takes either spelling
        if eq:
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 2
        else:
            value, i = "true", i + 1
        cfg[key] = _value(value)
    return cfg


IMPORTER = Importer(
    programs=LAUNCHERS,
    command=command,
    aliases={"llamafactory.cli": LAUNCHERS[0]},
    target=target,
)
