"""`tunedeck import` of ms-swift commands: `swift sft|pt|rlhf ...`, `megatron sft|pt|rlhf ...`,
ms-swift config files (`swift sft x.yaml`, `--config x.yaml`), and launchers running ms-swift
(`-m swift sft`, its entry modules and files). The swift backend's `Importer`.

Flags map to spec keys through keymap.py, the table the swift backend reads the other way; a
flag with no key, or a value its key cannot hold exactly as written, is kept in
swift.extra_args word for word. Flags that do not exist in the installed ms-swift get a
message naming the real one. Nothing is dropped without a warning naming it.
"""

from __future__ import annotations

import re
from typing import Any

from tunedeck.core.backends.importing import (
    Cluster,
    CommandImportError,
    Env,
    Imported,
    Importer,
    read_config,
    set_key as _set,
)
from tunedeck.core.backends.swift.flags import (
    FIXES_4X,
    FlagTableError,
    VALUE_FIXES,
    fixes_for,
    flag_tables,
    split_flags,
    suggest,
)
from tunedeck.core.backends.swift.keymap import (
    CREDENTIAL_FLAGS,
    HUB_TOKEN_VARS,
    MODEL_FROM,
    SECRET_FLAG_ENV,
)
from tunedeck.core.backends.swift.version import ASSUMED, installed_version
from tunedeck.core.spec import MASK, is_secret_name

SWIFT_SUBCOMMANDS = {"sft": "sft", "pt": "pt", "rlhf": "rlhf"}
MEGATRON_SUBCOMMANDS = {"sft": "megatron-sft", "pt": "megatron-pt", "rlhf": "megatron-rlhf"}
SWIFT_MODULES = {
    "swift.cli.sft": "sft",
    "swift.cli.pt": "pt",
    "swift.cli.rlhf": "rlhf",
    "swift.cli._megatron.sft": "megatron-sft",
    "swift.cli._megatron.pt": "megatron-pt",
    "swift.cli._megatron.rlhf": "megatron-rlhf",
}
# `-m MODULE SUBCOMMAND`: ms-swift's launcher modules, which take the subcommand next
SWIFT_MAINS = {
    "swift": "swift",
    "swift.cli.main": "swift",
    "swift.cli._megatron.main": "megatron",
    "swift.megatron": "megatron",
}


def _config_words(out: Imported, path: str, env: dict[str, str]) -> list[str]:
    """An ms-swift config file as the flags it stands for, the way ms-swift's launcher
    expands it (swift/cli/main.py parse_yaml_args): each key a flag, lists as several
    words, tables as JSON; its ENV table adds variables the command line did not set."""
    import json

    conf = read_config(path, "config file")
    words: list[str] = []
    for k, v in conf.items():
        if k == "ENV" and isinstance(v, dict):
            for name, val in v.items():
                if is_secret_name(str(name)):
                    out.warnings.append(
                        f"{name} (ENV of {path}) is a secret and was not "
                        "written to the spec; export it where you launch"
                    )
                else:
                    env.setdefault(str(name), str(val))
            continue
        words.append(f"--{k}")
        if isinstance(v, list):
            words += [str(x) for x in v]
        elif isinstance(v, dict):
            words.append(json.dumps(v, ensure_ascii=False))
        else:
            words.append(str(v))
    out.notes.append(
        f"{path}: its settings were read as flags (later command-line flags win, as in ms-swift)"
    )
    return words


def _items(argv: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """[(flag name without dashes, its values, the words as written)]; words before the first
    flag come under the name ""."""
    out: list[tuple[str, list[str], list[str]]] = []
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, val = word[2:].partition("=")
            out.append((name, [val] if eq else [], [word]))
        elif out:
            out[-1][1].append(word)
            out[-1][2].append(word)
        else:
            out.append(("", [word], [word]))
    return out


def _swift(out: Imported, command: str, argv: list[str], cluster: Cluster, env: Env) -> None:
    from tunedeck.core.spec import check_option
    from tunedeck.core.backends.swift.keymap import NotRepresentable, decode, reverse

    raw = out.raw
    raw["backend"] = "swift"
    raw.setdefault("swift", {})["command"] = command
    if command.startswith("megatron"):
        _set(raw, "parallel.strategy", "megatron")
    try:
        tables = flag_tables()
    except FlagTableError as e:  # ms-swift installed but its tables unreadable
        raise CommandImportError(str(e)) from None
    version = tables["version"] if tables else (installed_version() or ASSUMED)
    known = tables["commands"].get(command, {}) if tables else {}
    fixes = fixes_for(version)
    # a config file: `swift sft config.yaml ...` (ms-swift's launcher) or `--config FILE`
    if argv and not argv[0].startswith("-") and argv[0].endswith((".yaml", ".yml", ".json")):
        argv = _config_words(out, argv[0], env) + argv[1:]
    while "--config" in argv and "config" not in known:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise CommandImportError("--config without a file")
        argv = argv[:i] + _config_words(out, argv[i + 1], env) + argv[i + 2 :]
    items = _items(argv)
    if items and items[0][0] == "":
        first = items.pop(0)[1]
        raise CommandImportError(
            f"{' '.join(first)}: words before the first flag; ms-swift "
            "would stop on them (a config file must be .yaml, .yml or "
            ".json)"
        )
    by_flag = reverse(command)
    extra: list[str] = []
    # ms-swift keeps the last of a repeated flag (argparse); so does the spec
    last: dict[str, int] = {}
    named: list[tuple[str, list[str], list[str]]] = []
    for name, values, written in items:
        # argparse abbreviations and 3.x/blog names: rename with a message
        if known and name not in known:
            fix = fixes.get(name)
            if fix is not None and fix.flag and fix.flag in known:
                out.warnings.append(suggest(name, known, version))
                for old, new in fix.value_map:
                    values = [new if v == old else v for v in values]
                name = fix.flag
                written = [f"--{name}", *values]
            elif fix is not None and not fix.flag:
                out.warnings.append(
                    suggest(name, known, version) + f"; dropped --{name} {' '.join(values)}"
                )
                continue
            else:
                longer = sorted(k for k in known if k.startswith(name) and "-" not in k)
                if len(longer) == 1:
                    out.warnings.append(
                        f"--{name} is an abbreviation ms-swift would take as "
                        f"--{longer[0]}; written out"
                    )
                    name = longer[0]
                    written = [f"--{name}", *values]
        elif not known and name in FIXES_4X and FIXES_4X[name].flag:
            out.warnings.append(f"--{name}: {FIXES_4X[name].why}; use --{FIXES_4X[name].flag}")
            name = FIXES_4X[name].flag
            written = [f"--{name}", *values]
        canon = name.replace("-", "_")
        if canon in CREDENTIAL_FLAGS if (known and canon in known) else is_secret_name(canon):
            var = SECRET_FLAG_ENV.get(canon, "")
            how = (
                f"export {var or HUB_TOKEN_VARS} in the shell that launches (ms-swift reads "
                "it when the flag is absent; ranks inherit it)"
                if canon in SECRET_FLAG_ENV
                else "add it back in the form or with --set swift.extra_args (masked in the "
                "run's files, but `ps` shows command lines to every local user)"
            )
            out.warnings.append(f"--{name} is a secret and was not written to the spec; {how}")
            continue
        if MASK in values:
            out.warnings.append(
                f"--{name} {MASK} is a masked value from a tunedeck file, not "
                "the real one; left out"
            )
            continue
        vfix = VALUE_FIXES.get(canon, {})
        if len(values) == 1 and values[0] in vfix:
            new, why = vfix[values[0]]
            out.warnings.append(f"--{name} {values[0]}: {why}; becomes {' '.join(new)}")
            for f2, v2 in split_flags(list(new)):
                named.append((f2[2:], v2, [f2, *v2]))
            continue
        named.append((canon if canon in known or not known else name, values, written))
    for i, (name, values, written) in enumerate(named):
        if name in last and named[last[name]][1] != values:
            out.warnings.append(
                f"--{name} is given more than once; ms-swift keeps only the "
                f"last ({' '.join(values)}), and so does the spec"
            )
        last[name] = i
    quant: dict[str, tuple[list[str], list[str]]] = {}
    for i, (name, values, written) in enumerate(named):
        if last[name] != i:
            continue
        if known and name not in known:
            out.warnings.append(suggest(name, known, version) + "; kept in swift.extra_args")
            extra += written
            continue
        if _special(out, raw, cluster, name, values, quant):
            continue
        kf = by_flag.get(name)
        if kf is not None:
            try:
                value = decode(kf, values)
            except NotRepresentable:
                extra += written
                continue
            value, err = check_option(kf.key, value)
            if err:  # the spec's key cannot hold it as written: ms-swift gets it as written
                extra += written
                continue
            _set(raw, kf.key, value)
            continue
        extra += written
    _finish_quant(out, raw, quant, extra)
    if extra:
        raw["swift"]["extra_args"] = extra
    if "path" not in raw.get("model", {}) and not any(
        w.startswith("--") and w[2:].partition("=")[0] in MODEL_FROM for w in extra
    ):
        raise CommandImportError(
            "the command has no --model (nor --adapters, --ckpt_dir or --mcore_model naming one)"
        )


def _special(
    out: Imported, raw: dict, cluster: dict[str, Any], name: str, values: list[str], quant: dict
) -> bool:
    """Flags whose spec keys are more than one word to one key (keymap.SPECIAL). True when
    the flag went into the spec."""
    one = values[0] if len(values) == 1 else None
    if name == "model" and one:
        _set(raw, "model.path", one)
        return True
    if name == "dataset" and values:
        _set(raw, "data.datasets", list(values))
        return True
    if name == "output_dir" and one:
        _set(raw, "run.output_dir", one)
        return True
    if name in ("tuner_type", "train_type") and one in ("lora", "full"):
        _set(raw, "method.type", one)
        return True
    if name in ("quant_method", "quant_bits"):
        quant[name] = values
        return True
    if name == "deepspeed" and one:
        m = re.fullmatch(r"zero([0-3])(_offload)?", one)
        if m and not (m.group(2) and m.group(1) in "01"):
            _set(raw, "parallel.strategy", "deepspeed")
            _set(raw, "parallel.zero_stage", int(m.group(1)))
            _set(raw, "parallel.zero_offload", "all" if m.group(2) else "none")
            return True
    if name == "fsdp" and one == "fsdp2":
        _set(raw, "parallel.strategy", "fsdp2")
        return True
    if name == "ddp_backend" and one in ("nccl", "gloo"):
        cluster["dist_backend"] = one  # for tunedeck's own checks; the flag stays as written
    if name in ("model_name", "model_author") and len(values) == 2 and values[0] == values[1]:
        _set(raw, f"data.{name}", values[0])
        return True
    if (
        name == "global_batch_size"
        and one
        and one.isdigit()
        and raw["swift"]["command"].startswith("megatron")
    ):
        raw["_gbs"] = int(one)
        return True
    if name == "use_cpu" and (one or "true").lower() == "true":
        cluster["device"] = "cpu"  # and the flag stays as written
    return False


def _finish_quant(out: Imported, raw: dict, quant: dict, extra: list[str]) -> None:
    if not quant:
        return
    method = quant.get("quant_method", [""])
    bits = quant.get("quant_bits", [""])
    tuner = raw.get("method", {}).get("type", "lora")
    if method == ["bnb"] and bits in (["4"], ["8"]) and tuner == "lora":
        _set(raw, "method.type", "qlora")
        _set(raw, "method.quant_bits", int(bits[0]))
        return
    if "quant_bits" in quant and "quant_method" not in quant:
        out.warnings.append(
            f"--quant_bits {' '.join(bits)} without --quant_method does not "
            "quantise in ms-swift (QLoRA is --quant_method bnb); kept as "
            "written"
        )
    for name in ("quant_method", "quant_bits"):
        if name in quant:
            extra += [f"--{name}", *quant[name]]


def _finish_megatron_batch(out: Imported) -> None:
    gbs = out.raw.pop("_gbs", None)
    if gbs is None:
        return
    c = out.raw.get("cluster", {})
    p = out.raw.get("parallel", {})
    world = int(c.get("nproc_per_node") or 0) * int(c.get("nnodes") or 1)
    micro = int(out.raw.get("train", {}).get("per_device_batch_size", 1))
    dp = max(world // (int(p.get("tp", 1)) * int(p.get("pp", 1)) * int(p.get("cp", 1))), 1)
    accum, rem = divmod(gbs, micro * dp)
    if world and accum and not rem:
        _set(out.raw, "train.grad_accum", accum)
        _set(out.raw, "train.per_device_batch_size", micro)
        return
    # not a whole number of micro-batches here (or no process count): kept as written
    out.raw.setdefault("swift", {}).setdefault("extra_args", []).extend(
        ["--global_batch_size", str(gbs)]
    )
    out.notes.append(
        f"--global_batch_size {gbs} is kept as written (train.grad_accum could "
        f"not be derived from micro batch {micro} x data-parallel {dp})"
    )


def command(out: Imported, prog: str, rest: list[str], cluster: Cluster, env: Env) -> None:
    """`swift SUB ...` or `megatron SUB ...` as typed."""
    if prog == "swift" and rest[:1] == ["megatron"]:
        out.warnings.append(
            "`swift megatron ...` does not exist (KeyError: 'megatron'); "
            "the command is `megatron sft`"
        )
        prog, rest = "megatron", rest[1:]
    if prog == "swift":
        sub = rest[0].replace("_", "-") if rest else ""
        if sub not in SWIFT_SUBCOMMANDS:
            raise CommandImportError(
                f"`swift {sub}` is not a training command; tunedeck imports swift sft, pt and rlhf"
            )
        if "nproc_per_node" not in cluster and "nnodes" not in cluster:
            # the swift launcher starts torchrun only when NPROC_PER_NODE or NNODES is set
            cluster["nproc_per_node"] = 1
            out.notes.append(
                "NPROC_PER_NODE is unset, so ms-swift runs one process (a "
                "model bigger than a GPU is spread over the visible ones); "
                "set cluster.nproc_per_node for data-parallel ranks"
            )
        _swift(out, SWIFT_SUBCOMMANDS[sub], rest[1:], cluster, env)
        return
    sub = rest[0] if rest else ""
    if sub not in MEGATRON_SUBCOMMANDS:
        raise CommandImportError(f"`megatron {sub}`: tunedeck imports megatron sft, pt and rlhf")
    cluster.setdefault("nproc_per_node", 1)
    _swift(out, MEGATRON_SUBCOMMANDS[sub], rest[1:], cluster, env)


def target(
    out: Imported, module: str, words: list[str], cluster: Cluster, env: Env, launcher: str
) -> bool:
    """ms-swift run by a launcher: `-m swift sft`, `-m swift.cli.sft`, `.../swift/cli/sft.py`."""
    if module in SWIFT_MAINS:
        sub = words[0] if words else ""
        table = MEGATRON_SUBCOMMANDS if SWIFT_MAINS[module] == "megatron" else SWIFT_SUBCOMMANDS
        if sub.replace("_", "-") not in table:
            raise CommandImportError(
                f"{launcher} -m {module} {sub}: tunedeck imports the "
                f"training commands ({', '.join(table)})"
            )
        _swift(out, table[sub.replace("_", "-")], words[1:], cluster, env)
        return True
    if module in SWIFT_MODULES:
        _swift(out, SWIFT_MODULES[module], words, cluster, env)
        return True
    m = re.search(r"swift/cli/(?:(_megatron)/)?(sft|pt|rlhf)\.py$", words[0]) if words else None
    if module or not m:
        return False
    entry = f"swift.cli.{'_megatron.' if m.group(1) else ''}{m.group(2)}"
    _swift(out, SWIFT_MODULES[entry], words[1:], cluster, env)
    return True


IMPORTER = Importer(
    programs=("swift", "megatron"),
    command=command,
    aliases=dict(SWIFT_MAINS),
    target=target,
    finish=_finish_megatron_batch,
)
