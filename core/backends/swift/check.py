"""Ask the installed ms-swift itself which flags exist: run as a subprocess, because importing
swift pulls in torch, transformers and modelscope (8 s, 500 MB) that the CLI must not carry.

    python -m tunedeck.core.backends.swift.check --table          flag table of every command, as JSON
    python -m tunedeck.core.backends.swift.check --check < JOBS   JOBS = [[command, argv], ...]; prints one
                                                {"remaining": [...], "error": str|null} each
    python -m tunedeck.core.backends.swift.check --parse < JOBS   the same, plus "values": every field
                                                as ms-swift's parser fills it (JSON-safe)

Both build ms-swift's own HfArgumentParser over its argument dataclasses (as its CLI does) and
only parse: no __post_init__, so nothing is downloaded or loaded. The Megatron classes import
megatron-core at module level; without it their fields are read from the source with `ast`
and merged with the importable BaseArguments, so Megatron flags are still checked by name.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ARG_CLASSES = {"sft": "SftArguments", "pt": "PretrainArguments", "rlhf": "RLHFArguments"}
MEGATRON = ("megatron-sft", "megatron-pt", "megatron-rlhf")
# classes whose fields Megatron commands add on top of BaseArguments (swift/megatron/arguments)
MEGATRON_FILES = ("megatron_args.py", "megatron_base_args.py", "sft_args.py")
MEGATRON_EXTRA = {"megatron-rlhf": ("rlhf_args.py",)}


class _ParseError(Exception):
    pass


def _parser(command: str):
    from transformers import HfArgumentParser

    import swift.arguments as sa
    from swift.utils.utils import _patch_get_type_hints

    cls = getattr(sa, ARG_CLASSES[command] if command in ARG_CLASSES else "BaseArguments")
    with _patch_get_type_hints():
        p = HfArgumentParser([cls])
    p.exit_on_error = False

    def error(message):  # argparse would print usage and exit
        raise _ParseError(message)

    p.error = error
    return p


def jsonable(v):
    """A parsed value as JSON can carry it (enums by value, anything else by str)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return str(getattr(v, "value", v))


def _type_name(a) -> str:
    t = a.type
    name = getattr(t, "__name__", "") or ""
    if name == "string_to_bool" or a.const is False:
        return "bool"
    return name if name in ("int", "float") else "str"


def _table_from_parser(p) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for a in p._actions:
        for s in a.option_strings:
            if not s.startswith("--") or s == "--help":
                continue
            is_bool = getattr(a.type, "__name__", "") == "string_to_bool" or a.const is False
            default = a.default if a.const is not False else True  # --no_x stores False
            out[s[2:]] = {
                "bool": bool(is_bool),
                "choices": [str(c) for c in a.choices] if a.choices else None,
                "nargs": a.nargs if isinstance(a.nargs, str) else None,
                "type": _type_name(a),
                "dest": a.dest,
                "default": jsonable(default),
            }
    return out


def _ann_info(node: ast.expr) -> tuple[bool, list[str] | None, bool]:
    src = ast.unparse(node)
    choices = None
    if "Literal[" in src:
        lit = next(
            (
                n
                for n in ast.walk(node)
                if isinstance(n, ast.Subscript) and ast.unparse(n.value).endswith("Literal")
            ),
            None,
        )
        if lit is not None:
            elts = lit.slice.elts if isinstance(lit.slice, ast.Tuple) else [lit.slice]
            choices = [
                str(e.value) for e in elts if isinstance(e, ast.Constant) and e.value is not None
            ]
    is_list = "List[" in src or "list[" in src
    return src == "bool" or src == "Optional[bool]", choices, is_list


def _ast_default(value: ast.expr | None):
    """A field's default as written in the source: a constant, `field(default=...)`,
    `field(default_factory=lambda: [...])`; None when it cannot be read without running it."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
        for kw in value.keywords:
            if kw.arg == "default":
                return _ast_default(kw.value)
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Lambda):
                return _ast_default(kw.value.body)
        return None
    try:
        return jsonable(ast.literal_eval(value))
    except (ValueError, SyntaxError, TypeError):
        return None


def _megatron_table(command: str = "megatron-sft") -> dict[str, dict]:
    import importlib.util

    spec = importlib.util.find_spec("swift")
    folder = Path(spec.origin).parent / "megatron" / "arguments"
    table = _table_from_parser(_parser("megatron-base"))
    for name in MEGATRON_FILES + MEGATRON_EXTRA.get(command, ()):
        tree = ast.parse((folder / name).read_text(encoding="utf-8"))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    is_bool, choices, is_list = _ann_info(st.annotation)
                    field = st.target.id
                    src = ast.unparse(st.annotation)
                    typ = (
                        "bool"
                        if is_bool
                        else "int"
                        if re.search(r"\bint\b", src) and "str" not in src
                        else "float"
                        if re.search(r"\bfloat\b", src) and "str" not in src
                        else "str"
                    )
                    table[field] = {
                        "bool": is_bool,
                        "choices": choices,
                        "nargs": "+" if is_list else None,
                        "type": typ,
                        "dest": field,
                        "default": _ast_default(st.value),
                    }
                    table[field.replace("_", "-")] = table[field]
                    if is_bool:
                        table["no_" + field] = {
                            "bool": False,
                            "choices": None,
                            "nargs": 0,
                            "type": "bool",
                            "dest": field,
                            "default": True,
                        }
    return table


def table() -> dict:
    import swift

    out = {"version": swift.__version__, "commands": {}}
    for command in ARG_CLASSES:
        out["commands"][command] = _table_from_parser(_parser(command))
    for command in MEGATRON:
        try:
            out["commands"][command] = _megatron_table(command)
        except (OSError, SyntaxError, ImportError) as e:
            out["megatron_error"] = str(e)
    return out


def check(jobs: list, values: bool = False) -> list[dict]:
    """`values`: also every field as parsed (defaults included), for comparing two argvs."""
    results = []
    parsers: dict[str, object] = {}
    for command, argv in jobs:
        if command in MEGATRON:
            results.append(
                {
                    "remaining": None,
                    "error": "megatron classes need megatron-core; checked by name only",
                }
            )
            continue
        p = parsers.get(command) or parsers.setdefault(command, _parser(command))
        try:
            ns, remaining = p.parse_known_args(list(argv))
            res = {"remaining": remaining, "error": None}
            if values:
                res["values"] = {k: jsonable(v) for k, v in vars(ns).items()}
            results.append(res)
        except (_ParseError, argparse.ArgumentError) as e:
            results.append({"remaining": [], "error": str(e)})
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import logging

    logging.disable(logging.WARNING)
    if argv == ["--table"]:
        data = table()
    elif argv == ["--check"]:
        data = check(json.load(sys.stdin))
    elif argv == ["--parse"]:
        data = check(json.load(sys.stdin), values=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write("\n@@TUNEDECK@@" + json.dumps(data) + "\n")  # swift may print on import
    return 0


if __name__ == "__main__":
    sys.exit(main())
