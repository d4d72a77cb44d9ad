"""What every backend's importer shares (`tunedeck import`, core/backends/importer.py): the
imported spec as it is built (`Imported`), the refusal (`CommandImportError`) and the hooks a
backend gives (`Importer`, in `Backend.importer`).

The spec file never holds a secret: credential variables and flags (and their values) are left
out with a warning saying how to supply them. User text reaches the file only through the TOML
writer (tomli_w), or in the header's comments, escaped line by line (`comment`), so no pasted
word can leave a comment and become a live key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.spec import MASK, loads_spec, mask_argv

# what a backend's hooks are handed besides the words: the cluster keys and environment
# variables read so far (NPROC_PER_NODE=.. in front, a launcher's flags); they may add to both
Cluster = dict[str, Any]
Env = dict[str, str]


class CommandImportError(ValueError):
    """The command cannot be turned into a spec (the message says why)."""


@dataclass
class Imported:
    raw: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str = ""

    def to_toml(self) -> str:
        import tomli_w

        head = ["# Imported by `tunedeck import` from:", "#   " + comment(self.command)]
        for prefix, messages in (("WARNING: ", self.warnings), ("note: ", self.notes)):
            for m in messages:
                for i, line in enumerate(m.splitlines() or [""]):
                    head.append("# " + (prefix if i == 0 else " " * len(prefix)) + comment(line))
        return "\n".join(head) + "\n\n" + tomli_w.dumps(self.raw)

    def spec(self):
        return loads_spec(tomli_w_dumps(self.raw), source="<imported>")


def comment(text: str) -> str:
    """`text` as it may stand on one TOML comment line: every character that is not printable
    (a line break of any kind: \\n, \\r, U+0085, U+2028; other controls, which TOML refuses
    in comments; bidi controls, which reorder what an editor shows) written as its escape."""
    return "".join(c if c == "\t" or c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def tomli_w_dumps(raw: dict) -> str:
    import tomli_w

    return tomli_w.dumps(raw)


def drop_secrets(out: Imported, words: list[str], key: str) -> list[str]:
    """`words` without credential flags, their values and NAME=value credentials, each named
    in a warning (the spec file never holds a secret)."""
    shown = mask_argv(words)
    keep = [True] * len(words)
    names: list[str] = []
    for i, (w, m) in enumerate(zip(words, shown)):
        if w == m:
            continue
        keep[i] = False
        if m == MASK and i > 0:  # the value of the flag before it
            keep[i - 1] = False
            names.append(words[i - 1])
        else:
            names.append(m.partition("=")[0])
    if names:
        out.warnings.append(
            f"{', '.join(names)}: secret values were not written to the spec; "
            f"pass them through an environment variable the program reads "
            f"(env.NAME is masked in the run's files), or add them back in "
            f"the form or with --set {key} (masked in the run's files too, but "
            f"`ps` shows command lines to every local user)"
        )
    return [w for w, k in zip(words, keep) if k]


def read_config(path: str, what: str) -> dict[str, Any]:
    """A YAML or JSON file as a dict (one-line refusal naming it)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CommandImportError(
            f"{what} {path}: cannot read it here ({getattr(e, 'strerror', None) or e})"
        ) from None
    try:
        if p.suffix == ".json":
            import json

            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ImportError:
        raise CommandImportError(
            f"{what} {path}: reading YAML needs PyYAML (installed with ms-swift)"
        ) from None
    except Exception as e:  # noqa: BLE001 - any parser error is the file's problem
        raise CommandImportError(
            f"{what} {path}: not valid {p.suffix.lstrip('.') or 'YAML'}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CommandImportError(f"{what} {path}: expected a mapping of settings")
    return data


def set_key(raw: dict, key: str, value: Any) -> None:
    sect, _, leaf = key.partition(".")
    raw.setdefault(sect, {})[leaf] = value


def _takes_nothing(
    out: Imported, module: str, words: list[str], cluster: Cluster, env: Env, launcher: str
) -> bool:
    return False


def _no_finish(out: Imported) -> None:
    return None


@dataclass(frozen=True)
class Importer:
    """How a backend reads pasted commands (docs/adding-a-backend.md)."""

    # the first words of its own commands (`swift`, `megatron`); `python -m MODULE` for one
    # of them in `aliases` (MODULE → the word)
    programs: tuple[str, ...] = ()
    # (out, the program word, the words after it, cluster, env): fills out.raw; raises
    # CommandImportError naming what it cannot take
    command: Callable[[Imported, str, list[str], Cluster, Env], None] | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    # what a launcher (torchrun, accelerate launch, deepspeed, `python -m`) runs: (out, the
    # module after -m or "", the words after it or the script and its words, cluster, env,
    # the launcher's name) → True when it is this backend's and out.raw holds it
    target: Callable[[Imported, str, list[str], Cluster, Env, str], bool] = _takes_nothing
    # the backend of any script no other backend claims (tried last)
    catch_all: bool = False
    # after the launcher's settings are in out.raw (a batch size that needs the world size)
    finish: Callable[[Imported], None] = _no_finish
