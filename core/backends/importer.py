"""`tunedeck import 'COMMAND'`: a pasted launch command becomes a spec.

Understands `swift sft|pt|rlhf ...` (with NPROC_PER_NODE=.. CUDA_VISIBLE_DEVICES=.. in front),
`megatron sft|pt ...`, and `torchrun` / `python -m torch.distributed.run|launch` running a
script, a module, or ms-swift's own entry files. The command is split with shlex and never run.

Flags that do not exist in the installed ms-swift get a message naming the real one; flags the
spec has no field for are kept in swift.extra_args / script.args. Nothing is dropped silently.

The spec file never holds a secret: credential variables and flags (and their values) are left
out with a warning saying how to supply them. User text reaches the file only through the TOML
writer (tomli_w), or in the header's comments, escaped line by line (`comment`), so no pasted
word can leave a comment and become a live key.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from tunedeck.core.backends.swift import CREDENTIAL_FLAGS, HUB_TOKEN_VARS, SECRET_FLAG_ENV
from tunedeck.core.spec import MASK, SpecError, is_secret_name, loads_spec, mask_argv
from tunedeck.core.swift.flags import FIXES_4X, VALUE_FIXES, fixes_for, flag_tables, split_flags, suggest
from tunedeck.core.swift.version import ASSUMED, installed_version


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
                    head.append("# " + (prefix if i == 0 else " " * len(prefix))
                                + comment(line))
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


def _drop_secrets(out: Imported, words: list[str], key: str) -> list[str]:
    """`words` without credential flags, their values and NAME=value credentials, each named
    in a warning (the spec file never holds a secret)."""
    shown = mask_argv(words)
    keep = [True] * len(words)
    names: list[str] = []
    for i, (w, m) in enumerate(zip(words, shown)):
        if w == m:
            continue
        keep[i] = False
        if m == MASK and i > 0:        # the value of the flag before it
            keep[i - 1] = False
            names.append(words[i - 1])
        else:
            names.append(m.partition("=")[0])
    if names:
        out.warnings.append(f"{', '.join(names)}: secret values were not written to the spec; "
                            f"pass them through an environment variable the program reads "
                            f"(env.NAME is masked in the run's files), or add them back in "
                            f"the form or with --set {key} (masked in the run's files too, but "
                            f"`ps` shows command lines to every local user)")
    return [w for w, k in zip(words, keep) if k]


def tomli_w_dumps(raw: dict) -> str:
    import tomli_w

    return tomli_w.dumps(raw)


ENV_TO_CLUSTER = {"NPROC_PER_NODE": ("nproc_per_node", int), "NNODES": ("nnodes", int),
                  "NODE_RANK": ("node_rank", int), "MASTER_ADDR": ("master_addr", str),
                  "MASTER_PORT": ("master_port", int), "CUDA_VISIBLE_DEVICES": ("gpus", str)}
SWIFT_SUBCOMMANDS = {"sft": "sft", "pt": "pt", "rlhf": "rlhf"}
MEGATRON_SUBCOMMANDS = {"sft": "megatron-sft", "pt": "megatron-pt"}
SWIFT_MODULES = {"swift.cli.sft": "sft", "swift.cli.pt": "pt", "swift.cli.rlhf": "rlhf",
                 "swift.cli._megatron.sft": "megatron-sft",
                 "swift.cli._megatron.pt": "megatron-pt"}
_TORCHRUN_VALUE = {"nproc_per_node", "nproc-per-node", "nnodes", "node_rank", "node-rank",
                   "master_addr", "master-addr", "master_port", "master-port", "rdzv_endpoint",
                   "rdzv-endpoint", "rdzv_backend", "rdzv-backend", "rdzv_id", "rdzv-id",
                   "rdzv_conf", "rdzv-conf", "max_restarts", "max-restarts", "log_dir",
                   "log-dir", "redirects", "tee", "monitor_interval", "monitor-interval",
                   "start_method", "start-method", "role", "local_addr", "local-addr",
                   "logs_specs", "logs-specs", "local_ranks_filter", "local-ranks-filter"}
_TORCHRUN_BOOL = {"standalone", "use_env", "use-env", "no_python", "no-python", "module", "m",
                  "run_path", "run-path"}


def import_command(command: str) -> Imported:
    if "\x00" in command:
        raise CommandImportError("the command holds a NUL character, which no process can "
                                 "be passed")
    try:
        words = shlex.split(command, comments=False)
    except ValueError as e:
        raise CommandImportError(f"cannot split the command: {e}") from None
    words = [w for w in words if w != "\\"]
    out = Imported(raw={}, command=shlex.join(mask_argv(words)))
    cluster: dict[str, Any] = {}
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.S):
        k, _, v = words.pop(0).partition("=")
        if k in ENV_TO_CLUSTER:
            key, conv = ENV_TO_CLUSTER[k]
            try:
                cluster[key] = conv(v)
            except ValueError:
                raise CommandImportError(f"{k}={v!r}: expected a number") from None
        elif is_secret_name(k):
            out.warnings.append(f"{k} is a secret and was not written to the spec; export it "
                                "in the shell that launches (ranks inherit it)")
        else:
            env[k] = v
    if words and words[0] == "env":
        raise CommandImportError("put variables before the command without `env`")
    if not words:
        raise CommandImportError("no command after the environment variables")
    prog = words[0].rsplit("/", 1)[-1]
    rest = words[1:]
    if prog.startswith("python"):
        if rest[:2] == ["-m", "swift.cli.main"]:
            prog, rest = "swift", rest[2:]
        elif rest[:2] == ["-m", "swift.cli._megatron.main"]:
            prog, rest = "megatron", rest[2:]
        elif rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            if rest[1].endswith("launch"):
                out.notes.append("torch.distributed.launch is deprecated; tunedeck runs "
                                 "torch.distributed.run (torchrun)")
            prog, rest = "torchrun", rest[2:]
        elif rest and rest[0].endswith(".py"):
            prog = "torchrun"
            out.notes.append("a plain `python script.py` becomes one torchrun rank per GPU")
        else:
            raise CommandImportError(f"cannot tell what `{' '.join(words[:3])}` launches; expected "
                               "swift, megatron, torchrun or python -m torch.distributed.run")
    if prog == "swift":
        if rest[:1] == ["megatron"]:
            out.warnings.append("`swift megatron ...` does not exist (KeyError: 'megatron'); "
                                "the command is `megatron sft`")
            prog, rest = "megatron", rest[1:]
        else:
            sub = rest[0].replace("_", "-") if rest else ""
            if sub not in SWIFT_SUBCOMMANDS:
                raise CommandImportError(f"`swift {sub}` is not a training command; tunedeck imports "
                                   "swift sft, pt and rlhf")
            _swift(out, SWIFT_SUBCOMMANDS[sub], rest[1:], cluster)
    if prog == "megatron":
        sub = rest[0] if rest else ""
        if sub not in MEGATRON_SUBCOMMANDS:
            raise CommandImportError(f"`megatron {sub}`: tunedeck imports megatron sft and pt")
        _swift(out, MEGATRON_SUBCOMMANDS[sub], rest[1:], cluster)
    elif prog == "torchrun":
        _torchrun(out, rest, cluster)
    elif prog != "swift":
        raise CommandImportError(f"`{prog}` is not a launcher tunedeck knows (swift, megatron, "
                           "torchrun, python -m torch.distributed.run)")
    if "gpus" in cluster and "nproc_per_node" not in cluster:
        n = len([g for g in cluster["gpus"].split(",") if g.strip()])
        cluster["nproc_per_node"] = n
        if out.raw.get("backend") == "swift" and n > 1:
            out.warnings.append(f"CUDA_VISIBLE_DEVICES lists {n} GPUs but NPROC_PER_NODE is "
                                f"unset: ms-swift would run ONE process spreading the model "
                                f"over them (device_map, GPUs take turns); tunedeck runs {n} "
                                "data-parallel ranks")
    if cluster:
        if cluster.get("gpus") or cluster.get("nproc_per_node"):
            cluster.setdefault("device", "cuda")
        out.raw.setdefault("cluster", {}).update(cluster)
    if env:
        out.raw["env"] = env
    _finish_megatron_batch(out)
    try:
        out.spec()
    except SpecError as e:
        raise CommandImportError(f"the imported spec is invalid: {e}") from None
    return out


# -- torchrun ----------------------------------------------------------------------------

def _torchrun(out: Imported, words: list[str], cluster: dict[str, Any]) -> None:
    i = 0
    module = ""
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            break
        name, eq, val = w.lstrip("-").partition("=")
        if name == "m" or name == "module":
            if name == "m":  # `-m module` after the torchrun flags is the target
                module = words[i + 1] if i + 1 < len(words) else ""
                i += 2
                break
            i += 1
            continue
        if name in _TORCHRUN_BOOL:
            if name == "standalone":
                cluster.update(nnodes=1)
            i += 1
            continue
        if name not in _TORCHRUN_VALUE:
            raise CommandImportError(f"unknown torchrun flag {w}")
        if not eq:
            val = words[i + 1] if i + 1 < len(words) else ""
            i += 2
        else:
            i += 1
        key = name.replace("-", "_")
        if key == "nproc_per_node":
            if val.isdigit():
                cluster["nproc_per_node"] = int(val)
            else:
                out.notes.append(f"--nproc_per_node {val}: tunedeck uses one rank per visible "
                                 "GPU by default")
        elif key in ("nnodes", "node_rank", "master_port", "max_restarts"):
            num = val.split(":")[-1]
            if not num.isdigit():
                raise CommandImportError(f"torchrun --{name} {val}: expected a number")
            if key == "max_restarts":
                out.raw.setdefault("run", {})["max_restarts"] = int(num)
            else:
                cluster[key] = int(num)
        elif key == "master_addr":
            cluster["master_addr"] = val
        elif key == "rdzv_endpoint":
            host, _, port = val.rpartition(":")
            cluster["master_addr"] = host or val
            if port.isdigit():
                cluster["master_port"] = int(port)
        elif key in ("log_dir", "redirects", "tee", "rdzv_id", "rdzv_backend"):
            out.notes.append(f"torchrun --{name} is set by tunedeck itself (per-rank logs, c10d "
                             "rendezvous for several nodes)")
        elif key == "rdzv_conf":
            m = re.search(r"join_timeout=(\d+)", val)
            if m:
                cluster["join_timeout_s"] = int(m.group(1))
        else:
            out.notes.append(f"torchrun --{name} {val} is not carried over")
    target = words[i:]
    if module:
        if module in SWIFT_MODULES:
            _swift(out, SWIFT_MODULES[module], target, cluster)
            return
        out.raw.update(backend="script", script={
            "module": module, "args": _drop_secrets(out, target, "script.args")})
        return
    if not target:
        raise CommandImportError("torchrun command without a script or -m module")
    script, args = target[0], target[1:]
    m = re.search(r"swift/cli/(?:(_megatron)/)?(sft|pt|rlhf)\.py$", script)
    if m:
        _swift(out, SWIFT_MODULES[f"swift.cli.{'_megatron.' if m.group(1) else ''}{m.group(2)}"],
               args, cluster)
        return
    args = _drop_secrets(out, args, "script.args")
    out.raw.update(backend="script", script={"path": script, "args": args})
    if args:
        out.notes.append("script arguments are passed unchanged (script.args)")


# -- ms-swift flags ----------------------------------------------------------------------

def _int(v: str) -> int:
    return int(float(v))


def _float(v: str) -> float:
    return float(v)


def _bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes", ""):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise ValueError(v)


# ms-swift flag -> (spec key, converter). Flags not listed pass through in swift.extra_args.
MAP: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("model.path", str), "torch_dtype": ("model.dtype", str),
    "attn_impl": ("model.attn_impl", lambda v: {"flash_attn": "flash_attention_2"}.get(v, v)),
    "max_length": ("data.max_length", _int),
    "dataloader_num_workers": ("data.num_workers", _int),
    "split_dataset_ratio": ("data.val_split", _float), "val_dataset": ("data.val_path", str),
    "packing": ("data.packing", _bool),
    "lora_rank": ("method.lora_rank", _int), "lora_alpha": ("method.lora_alpha", _int),
    "lora_dropout": ("method.lora_dropout", _float),
    "max_steps": ("train.max_steps", _int), "train_iters": ("train.max_steps", _int),
    "per_device_train_batch_size": ("train.per_device_batch_size", _int),
    "micro_batch_size": ("train.per_device_batch_size", _int),
    "gradient_accumulation_steps": ("train.grad_accum", _int),
    "learning_rate": ("train.learning_rate", _float), "lr": ("train.learning_rate", _float),
    "weight_decay": ("train.weight_decay", _float),
    "warmup_steps": ("train.warmup_steps", _int), "lr_warmup_iters": ("train.warmup_steps", _int),
    "lr_scheduler_type": ("train.lr_scheduler", str), "lr_decay_style": ("train.lr_scheduler", str),
    "max_grad_norm": ("train.max_grad_norm", _float), "clip_grad": ("train.max_grad_norm", _float),
    "seed": ("train.seed", _int), "save_steps": ("train.save_steps", _int),
    "save_total_limit": ("train.save_total_limit", _int), "eval_steps": ("train.eval_steps", _int),
    "gradient_checkpointing": ("train.gradient_checkpointing", _bool),
    "resume_from_checkpoint": ("train.resume_from", str),
    "output_dir": ("run.output_dir", str),
    "tensor_model_parallel_size": ("parallel.tp", _int),
    "pipeline_model_parallel_size": ("parallel.pp", _int),
    "context_parallel_size": ("parallel.cp", _int),
    "expert_model_parallel_size": ("parallel.ep", _int),
    "sequence_parallel": ("parallel.sequence_parallel", _bool),
    "rlhf_type": ("swift.rlhf_type", str), "use_vllm": ("swift.use_vllm", _bool),
    "vllm_mode": ("swift.vllm_mode", str),
}
# tunedeck sets these itself on every run; an imported value would only be overridden
OURS = {"logging_steps", "ddp_find_unused_parameters", "add_version"}


def _set(raw: dict, key: str, value: Any) -> None:
    sect, _, leaf = key.partition(".")
    raw.setdefault(sect, {})[leaf] = value


def _swift(out: Imported, command: str, argv: list[str], cluster: dict[str, Any]) -> None:
    raw = out.raw
    raw["backend"] = "swift"
    raw.setdefault("swift", {})["command"] = command
    if command.startswith("megatron"):
        _set(raw, "parallel.strategy", "megatron")
    tables = flag_tables()
    version = tables["version"] if tables else (installed_version() or ASSUMED)
    known = tables["commands"].get(command, {}) if tables else {}
    fixes = fixes_for(version)
    extra: list[str] = []
    pairs = split_flags(argv)
    if pairs and pairs[0][0] == "":
        first = pairs.pop(0)[1]
        if first and first[0].endswith((".yaml", ".yml", ".json")):
            raise CommandImportError(f"{first[0]}: tunedeck cannot read ms-swift config files; paste "
                               "the flags instead")
        out.warnings.append(f"stray words {first} before the first flag were dropped")
    quant: dict[str, str] = {}
    for flag, values in pairs:
        name = flag[2:]
        # argparse abbreviations and 3.x/blog names: rename with a message
        if known and name not in known:
            fix = fixes.get(name)
            if fix is not None and fix.flag and fix.flag in known:
                out.warnings.append(suggest(name, known, version))
                for old, new in fix.value_map:
                    values = [new if v == old else v for v in values]
                name = fix.flag
            elif fix is not None and not fix.flag:
                out.warnings.append(suggest(name, known, version) + f"; dropped --{name} "
                                    f"{' '.join(values)}")
                continue
            else:
                longer = sorted(k for k in known if k.startswith(name) and "-" not in k)
                if len(longer) == 1:
                    out.warnings.append(f"--{name} is an abbreviation ms-swift would take as "
                                        f"--{longer[0]}; written out")
                    name = longer[0]
        elif not known and name in FIXES_4X and FIXES_4X[name].flag:
            out.warnings.append(f"--{name}: {FIXES_4X[name].why}; use --{FIXES_4X[name].flag}")
            name = FIXES_4X[name].flag
        canon = name.replace("-", "_")
        if canon in CREDENTIAL_FLAGS if (known and canon in known) else is_secret_name(canon):
            var = SECRET_FLAG_ENV.get(canon, "")
            how = (f"export {var or HUB_TOKEN_VARS} in the shell that launches (ms-swift reads "
                   "it when the flag is absent; ranks inherit it)" if canon in SECRET_FLAG_ENV
                   else "add it back in the form or with --set swift.extra_args (masked in the "
                   "run's files, but `ps` shows command lines to every local user)")
            out.warnings.append(f"--{name} is a secret and was not written to the spec; {how}")
            continue
        vfix = VALUE_FIXES.get(canon, {})
        if len(values) == 1 and values[0] in vfix:
            new, why = vfix[values[0]]
            out.warnings.append(f"--{name} {values[0]}: {why}; becomes {' '.join(new)}")
            sub = split_flags(list(new))
            name, values = sub[0][0][2:], sub[0][1]
            canon = name
            for f2, v2 in sub[1:]:
                quant[f2[2:]] = v2[0]
        if known and canon not in known and name not in known:
            out.warnings.append(suggest(name, known, version) + "; kept in swift.extra_args")
            extra += [flag, *values]
            continue
        if canon in OURS:
            continue
        if canon in ("tuner_type", "train_type"):
            if values and values[0] in ("lora", "full"):
                _set(raw, "method.type", values[0])
            else:
                extra += [f"--{canon}", *values]
                out.notes.append(f"tuner {values} has no spec field; kept in swift.extra_args")
            continue
        if canon in ("quant_method", "quant_bits"):
            quant[canon] = values[0] if values else ""
            continue
        if canon == "dataset":
            local = [v for v in values if v != "swift/self-cognition"
                     and not v.startswith("swift/self-cognition#")]
            if len(local) != len(values):
                _set(raw, "data.format", "self_cognition")
            if local:
                _set(raw, "data.path", local[0])
            if len(local) > 1:
                extra += ["--dataset", *local[1:]]
                out.warnings.append(f"spec data.path takes one dataset; {local[1:]} kept in "
                                    "swift.extra_args (ms-swift appends them)")
            continue
        if canon in ("model_name", "model_author"):
            _set(raw, f"data.{canon}", values[-1] if values else "")
            continue
        if canon == "target_modules":
            _set(raw, "method.target_modules", values)
            continue
        if canon == "deepspeed" and values:
            m = re.fullmatch(r"zero([0-3])(_offload)?", values[0])
            if m:
                _set(raw, "parallel.strategy", "deepspeed")
                _set(raw, "parallel.zero_stage", int(m.group(1)))
                _set(raw, "parallel.zero_offload", "all" if m.group(2) else "none")
                continue
        if canon == "fsdp" and values == ["fsdp2"]:
            _set(raw, "parallel.strategy", "fsdp2")
            continue
        if canon == "use_cpu" and values and _bool(values[0]):
            cluster["device"] = "cpu"
            continue
        if canon == "ddp_backend" and values and values[0] in ("nccl", "gloo"):
            cluster["dist_backend"] = values[0]
            continue
        if canon == "report_to" and values == ["none"]:
            continue
        if canon == "global_batch_size" and values:
            out.raw.setdefault("_gbs", _int(values[0]))
            continue
        if canon == "num_train_epochs":
            out.warnings.append("tunedeck specs count optimizer steps: --num_train_epochs is "
                                "kept in swift.extra_args but train.max_steps overrides it; "
                                "set train.max_steps")
        if canon in MAP:
            key, conv = MAP[canon]
            try:
                _set(raw, key, conv(values[0] if values else ""))
            except (ValueError, IndexError):
                out.warnings.append(f"--{name} {' '.join(values)}: not a valid value for "
                                    f"{key}; kept in swift.extra_args")
                extra += [f"--{name}", *values]
            continue
        extra += [f"--{name}", *values]
    if quant:
        if quant.get("quant_method") == "bnb":
            _set(raw, "method.type", "qlora")
            bits = quant.get("quant_bits", "4")
            if bits in ("4", "8"):
                _set(raw, "method.quant_bits", int(bits))
        elif quant.get("quant_bits") and not quant.get("quant_method"):
            out.warnings.append(f"--quant_bits {quant['quant_bits']} without --quant_method "
                                "does not quantise in ms-swift; QLoRA needs --quant_method bnb "
                                "(imported as method.type = \"qlora\")")
            _set(raw, "method.type", "qlora")
        else:
            for k, v in quant.items():
                extra += [f"--{k}", v]
    if extra:
        raw["swift"]["extra_args"] = extra
    if "path" not in raw.get("model", {}):
        raise CommandImportError("the command has no --model")


def _finish_megatron_batch(out: Imported) -> None:
    gbs = out.raw.pop("_gbs", None)
    if gbs is None:
        return
    c = out.raw.get("cluster", {})
    p = out.raw.get("parallel", {})
    world = int(c.get("nproc_per_node") or 0) * int(c.get("nnodes") or 1)
    micro = int(out.raw.get("train", {}).get("per_device_batch_size", 1))
    if not world:
        out.warnings.append(f"--global_batch_size {gbs}: NPROC_PER_NODE unknown, so "
                            "train.grad_accum could not be derived; set it")
        return
    dp = max(world // (int(p.get("tp", 1)) * int(p.get("pp", 1)) * int(p.get("cp", 1))), 1)
    accum, rem = divmod(gbs, micro * dp)
    if rem or not accum:
        out.warnings.append(f"--global_batch_size {gbs} is not a multiple of micro batch "
                            f"{micro} x data-parallel {dp}; Megatron would refuse it")
        accum = max(accum, 1)
    _set(out.raw, "train.grad_accum", accum)
