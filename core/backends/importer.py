"""`tunedeck import 'COMMAND'`: a pasted launch command becomes a spec.

Understands `swift sft|pt|rlhf ...` (with NPROC_PER_NODE=.. CUDA_VISIBLE_DEVICES=.. in front),
`megatron sft|pt|rlhf ...`, ms-swift config files (`swift sft x.yaml`, `--config x.yaml`), and
`torchrun` / `python -m torch.distributed.run|launch` / `accelerate launch` / `deepspeed`
running a script, a module, `-m swift sft` or ms-swift's own entry files (launchers become
tunedeck's torchrun with the same processes and nodes). The command is split with shlex and
never run, so a word still holding `$VAR` is refused by name.

Flags map to spec keys through core/backends/swift/keymap.py, the table the swift backend reads the
other way; a flag with no key, or a value its key cannot hold exactly as written, is kept in
swift.extra_args word for word. Flags that do not exist in the installed ms-swift get a
message naming the real one. Nothing is dropped without a warning naming it.

The spec file never holds a secret: credential variables and flags (and their values) are left
out with a warning saying how to supply them. User text reaches the file only through the TOML
writer (tomli_w), or in the header's comments, escaped line by line (`comment`), so no pasted
word can leave a comment and become a live key.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.backends.swift import (
    CREDENTIAL_FLAGS,
    HUB_TOKEN_VARS,
    MODEL_FROM,
    SECRET_FLAG_ENV,
)
from tunedeck.core.spec import MASK, SpecError, is_secret_name, loads_spec, mask_argv
from tunedeck.core.backends.swift.flags import (
    FIXES_4X,
    VALUE_FIXES,
    fixes_for,
    flag_tables,
    split_flags,
    suggest,
)
from tunedeck.core.backends.swift.version import ASSUMED, installed_version


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


def tomli_w_dumps(raw: dict) -> str:
    import tomli_w

    return tomli_w.dumps(raw)


ENV_TO_CLUSTER = {
    "NPROC_PER_NODE": ("nproc_per_node", int),
    "NNODES": ("nnodes", int),
    "NODE_RANK": ("node_rank", int),
    "MASTER_ADDR": ("master_addr", str),
    "MASTER_PORT": ("master_port", int),
    "CUDA_VISIBLE_DEVICES": ("gpus", str),
}
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
_TORCHRUN_VALUE = {
    "nproc_per_node",
    "nproc-per-node",
    "nnodes",
    "node_rank",
    "node-rank",
    "master_addr",
    "master-addr",
    "master_port",
    "master-port",
    "rdzv_endpoint",
    "rdzv-endpoint",
    "rdzv_backend",
    "rdzv-backend",
    "rdzv_id",
    "rdzv-id",
    "rdzv_conf",
    "rdzv-conf",
    "max_restarts",
    "max-restarts",
    "log_dir",
    "log-dir",
    "redirects",
    "tee",
    "monitor_interval",
    "monitor-interval",
    "start_method",
    "start-method",
    "role",
    "local_addr",
    "local-addr",
    "logs_specs",
    "logs-specs",
    "local_ranks_filter",
    "local-ranks-filter",
    "local_rank",
    "local-rank",
}
_TORCHRUN_BOOL = {
    "standalone",
    "use_env",
    "use-env",
    "no_python",
    "no-python",
    "module",
    "m",
    "run_path",
    "run-path",
}
# accelerate launch: flags taking a value / flags alone
_ACCEL_VALUE = {
    "config_file",
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "mixed_precision",
    "gpu_ids",
    "deepspeed_config_file",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "gradient_accumulation_steps",
    "dynamo_backend",
    "num_cpu_threads_per_process",
    "rdzv_backend",
    "rdzv_conf",
    "max_restarts",
    "monitor_interval",
    "fsdp_sharding_strategy",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_state_dict_type",
    "fsdp_offload_params",
    "fsdp_version",
    "deepspeed_hostfile",
    "deepspeed_multinode_launcher",
    "same_network",
    "main_training_function",
    "fsdp_backward_prefetch",
    "fsdp_min_num_params",
    "tpu_zone",
    "log_dir",
}
_ACCEL_BOOL = {
    "multi_gpu",
    "use_deepspeed",
    "use_fsdp",
    "cpu",
    "use_cpu",
    "debug",
    "quiet",
    "m",
    "module",
    "no_python",
    "tee",
    "use_megatron_lm",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_use_orig_params",
    "fsdp_sync_module_states",
    "fsdp_activation_checkpointing",
}
# deepspeed launcher
_DS_VALUE = {
    "hostfile",
    "H",
    "include",
    "i",
    "exclude",
    "e",
    "num_nodes",
    "num_gpus",
    "master_port",
    "master_addr",
    "launcher",
    "launcher_args",
    "ssh_port",
    "bind_core_list",
    "elastic_training",
    "min_elastic_nodes",
    "max_elastic_nodes",
}
_DS_BOOL = {
    "no_python",
    "no_local_rank",
    "no_ssh_check",
    "force_multi",
    "save_pid",
    "enable_each_rank_log",
    "autotuning",
    "module",
    "bind_cores_to_rank",
    "no_ssh",
}
_SHELL_VAR = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|\()")


def import_command(command: str) -> Imported:
    if "\x00" in command:
        raise CommandImportError(
            "the command holds a NUL character, which no process can be passed"
        )
    try:
        words = shlex.split(join_lines(command), comments=False)
    except ValueError as e:
        raise CommandImportError(f"cannot split the command: {e}") from None
    words = [w for w in words if w != "\\"]
    for w in words:
        m = _SHELL_VAR.search(w)
        if m:
            raise CommandImportError(
                f"{clean_word(w)}: ${m.group(1).strip('{}(')} is an unexpanded shell variable; "
                "tunedeck never runs a shell, so paste the command with its values (e.g. "
                "what `echo` prints in the shell that sets them)"
            )
    out = Imported(raw={}, command=shlex.join(mask_argv(words)))
    cluster: dict[str, Any] = {}
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.S):
        k, _, v = words.pop(0).partition("=")
        if v == MASK:
            out.warnings.append(
                f"{k}={MASK} is a masked value from a tunedeck file, not the "
                "real one; left out (export the real value where you launch)"
            )
        elif k in ENV_TO_CLUSTER:
            key, conv = ENV_TO_CLUSTER[k]
            try:
                cluster[key] = conv(v)
            except ValueError:
                raise CommandImportError(f"{k}={v!r}: expected a number") from None
        elif is_secret_name(k):
            out.warnings.append(
                f"{k} is a secret and was not written to the spec; export it "
                "in the shell that launches (ranks inherit it)"
            )
        else:
            env[k] = v
    if words and words[0] == "env":
        raise CommandImportError("put variables before the command without `env`")
    if not words:
        raise CommandImportError("no command after the environment variables")
    prog = words[0].rsplit("/", 1)[-1]
    rest = words[1:]
    launched_by_torchrun = "nproc_per_node" in cluster or "nnodes" in cluster
    if prog.startswith("python"):
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in SWIFT_MAINS:
            prog, rest = SWIFT_MAINS[rest[1]], rest[2:]
        elif rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in SWIFT_MODULES:
            # one python process running ms-swift's entry module directly
            cluster.setdefault("nproc_per_node", 1)
            _swift(out, SWIFT_MODULES[rest[1]], rest[2:], cluster, env)
            prog = ""
        elif rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            if rest[1].endswith("launch"):
                out.notes.append(
                    "torch.distributed.launch is deprecated; tunedeck runs "
                    "torch.distributed.run (torchrun)"
                )
            prog, rest = "torchrun", rest[2:]
        elif rest and rest[0].endswith(".py"):
            if re.search(r"swift/cli/(?:_megatron/)?(sft|pt|rlhf)\.py$", rest[0]):
                cluster.setdefault("nproc_per_node", 1)
            prog = "torchrun"
            out.notes.append("a plain `python script.py` runs as one torchrun rank")
            cluster.setdefault("nproc_per_node", 1)
        else:
            raise CommandImportError(
                f"cannot tell what `{' '.join(words[:3])}` launches; "
                "expected swift, megatron, torchrun, accelerate launch, "
                "deepspeed or python -m torch.distributed.run"
            )
    if prog == "swift":
        if rest[:1] == ["megatron"]:
            out.warnings.append(
                "`swift megatron ...` does not exist (KeyError: 'megatron'); "
                "the command is `megatron sft`"
            )
            prog, rest = "megatron", rest[1:]
        else:
            sub = rest[0].replace("_", "-") if rest else ""
            if sub not in SWIFT_SUBCOMMANDS:
                raise CommandImportError(
                    f"`swift {sub}` is not a training command; tunedeck "
                    "imports swift sft, pt and rlhf"
                )
            if not launched_by_torchrun:
                # the swift launcher starts torchrun only when NPROC_PER_NODE or NNODES is set
                cluster["nproc_per_node"] = 1
                out.notes.append(
                    "NPROC_PER_NODE is unset, so ms-swift runs one process (a "
                    "model bigger than a GPU is spread over the visible ones); "
                    "set cluster.nproc_per_node for data-parallel ranks"
                )
            _swift(out, SWIFT_SUBCOMMANDS[sub], rest[1:], cluster, env)
    if prog == "megatron":
        sub = rest[0] if rest else ""
        if sub not in MEGATRON_SUBCOMMANDS:
            raise CommandImportError(
                f"`megatron {sub}`: tunedeck imports megatron sft, pt and rlhf"
            )
        cluster.setdefault("nproc_per_node", 1)
        _swift(out, MEGATRON_SUBCOMMANDS[sub], rest[1:], cluster, env)
    elif prog == "torchrun":
        _torchrun(out, rest, cluster, env)
    elif prog == "accelerate":
        _accelerate(out, rest, cluster, env)
    elif prog == "deepspeed":
        _deepspeed(out, rest, cluster, env)
    elif prog not in ("swift", ""):
        raise CommandImportError(
            f"`{prog}` is not a launcher tunedeck knows (swift, megatron, "
            "torchrun, accelerate launch, deepspeed, python -m "
            "torch.distributed.run)"
        )
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


def join_lines(command: str) -> str:
    """A pasted script's line continuations (backslash, newline) removed as the shell does:
    outside single quotes only; a line break inside quotes stays part of its word."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(command):
        c = command[i]
        if c == "\\" and quote != "'" and command[i + 1 : i + 3] == "\r\n":
            i += 3
            continue
        if c == "\\" and quote != "'" and command[i + 1 : i + 2] == "\n":
            i += 2
            continue
        if c == "\\" and quote != "'" and i + 1 < len(command):
            out.append(command[i : i + 2])  # an escaped character stays escaped
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        out.append(c)
        i += 1
    return "".join(out)


def clean_word(w: str) -> str:
    return w if len(w) <= 80 else w[:77] + "..."


# -- launchers ---------------------------------------------------------------------------


def _target(
    out: Imported,
    words: list[str],
    module: str,
    cluster: dict[str, Any],
    env: dict[str, str],
    launcher: str,
) -> None:
    """What a launcher runs: ms-swift (its modules, its files, `-m swift sft`) or a script."""
    if module in SWIFT_MAINS:
        sub = words[0] if words else ""
        table = MEGATRON_SUBCOMMANDS if SWIFT_MAINS[module] == "megatron" else SWIFT_SUBCOMMANDS
        if sub.replace("_", "-") not in table:
            raise CommandImportError(
                f"{launcher} -m {module} {sub}: tunedeck imports the "
                f"training commands ({', '.join(table)})"
            )
        _swift(out, table[sub.replace("_", "-")], words[1:], cluster, env)
        return
    if module:
        if module in SWIFT_MODULES:
            _swift(out, SWIFT_MODULES[module], words, cluster, env)
            return
        out.raw.update(
            backend="script",
            script={"module": module, "args": _drop_secrets(out, words, "script.args")},
        )
        return
    if not words:
        raise CommandImportError(f"{launcher} command without a script or -m module")
    script, args = words[0], words[1:]
    m = re.search(r"swift/cli/(?:(_megatron)/)?(sft|pt|rlhf)\.py$", script)
    if m:
        _swift(
            out,
            SWIFT_MODULES[f"swift.cli.{'_megatron.' if m.group(1) else ''}{m.group(2)}"],
            args,
            cluster,
            env,
        )
        return
    args = _drop_secrets(out, args, "script.args")
    out.raw.update(backend="script", script={"path": script, "args": args})
    if args:
        out.notes.append("script arguments are passed unchanged (script.args)")


def _launcher_flags(
    words: list[str], value: set[str], boolean: set[str], launcher: str
) -> tuple[dict[str, str], str, list[str]]:
    """({flag: value}, module after -m, the words after the launcher's own flags)."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            break
        name, eq, val = w.lstrip("-").partition("=")
        if name in ("m", "module") and launcher != "deepspeed":
            if i + 1 < len(words) and not eq:
                return flags, words[i + 1], words[i + 2 :]
            i += 1
            continue
        if name in boolean or name.replace("-", "_") in boolean:
            flags[name.replace("-", "_")] = "true"
            i += 1
            continue
        if name not in value and name.replace("-", "_") not in value:
            raise CommandImportError(f"unknown {launcher} flag {w}")
        if not eq:
            val = words[i + 1] if i + 1 < len(words) else ""
            i += 2
        else:
            i += 1
        flags[name.replace("-", "_")] = val
    return flags, "", words[i:]


def _torchrun(
    out: Imported, words: list[str], cluster: dict[str, Any], env: dict[str, str]
) -> None:
    flags, module, target = _launcher_flags(words, _TORCHRUN_VALUE, _TORCHRUN_BOOL, "torchrun")
    cluster.setdefault("nproc_per_node", 1)  # torchrun's own default
    for key, val in flags.items():
        if key == "nproc_per_node":
            if val.isdigit():
                cluster["nproc_per_node"] = int(val)
            else:
                cluster["nproc_per_node"] = 0
                out.notes.append(
                    f"--nproc_per_node {val}: tunedeck uses one rank per visible GPU by default"
                )
        elif key in ("nnodes", "node_rank", "master_port", "max_restarts"):
            num = val.split(":")[-1]
            if not num.isdigit():
                raise CommandImportError(f"torchrun --{key} {val}: expected a number")
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
            out.notes.append(
                f"torchrun --{key} is set by tunedeck itself (per-rank logs, c10d "
                "rendezvous for several nodes)"
            )
        elif key == "rdzv_conf":
            m = re.search(r"join_timeout=(\d+)", val)
            if m:
                cluster["join_timeout_s"] = int(m.group(1))
        elif key == "standalone":
            cluster["nnodes"] = 1
        elif key not in ("use_env", "module", "m", "local_rank"):
            out.notes.append(f"torchrun --{key} {val} is not carried over")
    _target(out, target, module, cluster, env, "torchrun")


def _accelerate(
    out: Imported, words: list[str], cluster: dict[str, Any], env: dict[str, str]
) -> None:
    if words[:1] != ["launch"]:
        raise CommandImportError(
            "`accelerate` without `launch`: tunedeck imports accelerate launch commands"
        )
    flags, module, target = _launcher_flags(words[1:], _ACCEL_VALUE, _ACCEL_BOOL, "accelerate")
    conf: dict[str, Any] = {}
    if flags.get("config_file"):
        conf = _read_config(flags["config_file"], "accelerate --config_file")
    merged = {**{k: str(v) for k, v in conf.items() if not isinstance(v, dict)}, **flags}
    machines = int(merged.get("num_machines") or 1)
    procs = int(merged.get("num_processes") or 0)
    cluster["nnodes"] = machines
    if procs:
        cluster["nproc_per_node"] = max(procs // machines, 1)  # accelerate counts them all
    else:
        cluster.setdefault("nproc_per_node", 0)
    if machines > 1:
        cluster["node_rank"] = int(merged.get("machine_rank") or 0)
        if merged.get("main_process_ip"):
            cluster["master_addr"] = merged["main_process_ip"]
    if merged.get("main_process_port"):
        cluster["master_port"] = int(merged["main_process_port"])
    if merged.get("gpu_ids") and merged["gpu_ids"] != "all":
        cluster["gpus"] = merged["gpu_ids"]
    left = sorted(
        k
        for k in merged
        if k
        not in (
            "config_file",
            "num_machines",
            "num_processes",
            "machine_rank",
            "main_process_ip",
            "main_process_port",
            "gpu_ids",
            "multi_gpu",
            "compute_environment",
            "debug",
            "distributed_type",
            "downcast_bf16",
            "rdzv_backend",
            "same_network",
            "tpu_env",
            "tpu_use_cluster",
            "tpu_use_sudo",
            "use_cpu",
            "main_training_function",
        )
    )
    left += sorted(k for k, v in conf.items() if isinstance(v, dict))
    out.notes.append(
        "accelerate launch imported as torchrun with the same processes and "
        "nodes"
        + (
            f"; not carried over: {', '.join(left)} (give ms-swift "
            "--deepspeed / --fsdp / --torch_dtype instead)"
            if left
            else ""
        )
    )
    if left:
        out.warnings.append(
            f"accelerate settings {', '.join(left)} are not carried over: "
            "tunedeck launches with torchrun"
        )
    _target(out, target, module, cluster, env, "accelerate launch")


def _deepspeed(
    out: Imported, words: list[str], cluster: dict[str, Any], env: dict[str, str]
) -> None:
    flags, _, target = _launcher_flags(words, _DS_VALUE, _DS_BOOL, "deepspeed")
    hosts: list[tuple[str, int]] = []
    hostfile = flags.get("hostfile") or flags.get("H")
    if hostfile:
        try:
            text = Path(hostfile).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CommandImportError(
                f"deepspeed --hostfile {hostfile}: cannot read it here "
                f"({getattr(e, 'strerror', None) or e}); tunedeck needs "
                "its hosts and slots"
            ) from None
        for line in text.splitlines():
            m = re.match(r"\s*([^\s#]+)\s+slots\s*=\s*(\d+)", line)
            if m:
                hosts.append((m.group(1), int(m.group(2))))
    include = flags.get("include") or flags.get("i")
    if include:
        parts = [p.partition(":") for p in include.split("@")]
        hosts = [(h, len(g.split(",")) if g else dict(hosts).get(h, 1)) for h, _, g in parts]
        if len(parts) == 1 and parts[0][2]:
            cluster["gpus"] = parts[0][2]
    if flags.get("num_nodes"):
        cluster["nnodes"] = int(flags["num_nodes"])
    elif hosts:
        cluster["nnodes"] = len(hosts)
    if flags.get("num_gpus"):
        cluster["nproc_per_node"] = int(flags["num_gpus"])
    elif hosts:
        cluster["nproc_per_node"] = hosts[0][1]
    else:
        cluster.setdefault("nproc_per_node", 0)  # every visible GPU, as deepspeed does
    if len(hosts) > 1:
        cluster["master_addr"] = flags.get("master_addr") or hosts[0][0]
        if len({n for _, n in hosts}) > 1:
            out.warnings.append(
                "the hostfile gives nodes different slot counts; tunedeck "
                "runs the same number of ranks on every node"
            )
    if flags.get("master_port"):
        cluster["master_port"] = int(flags["master_port"])
    out.notes.append(
        "deepspeed launcher imported as torchrun with the same processes and "
        "nodes (tunedeck starts each node itself, no pdsh/ssh)"
    )
    _target(out, target, "", cluster, env, "deepspeed")


def _read_config(path: str, what: str) -> dict[str, Any]:
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


def _config_words(out: Imported, path: str, env: dict[str, str]) -> list[str]:
    """An ms-swift config file as the flags it stands for, the way ms-swift's launcher
    expands it (swift/cli/main.py parse_yaml_args): each key a flag, lists as several
    words, tables as JSON; its ENV table adds variables the command line did not set."""
    import json

    conf = _read_config(path, "config file")
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


# -- ms-swift flags ----------------------------------------------------------------------


def _set(raw: dict, key: str, value: Any) -> None:
    sect, _, leaf = key.partition(".")
    raw.setdefault(sect, {})[leaf] = value


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


def _swift(
    out: Imported, command: str, argv: list[str], cluster: dict[str, Any], env: dict[str, str]
) -> None:
    from tunedeck.core.spec import check_option
    from tunedeck.core.backends.swift.keymap import NotRepresentable, decode, reverse

    raw = out.raw
    raw["backend"] = "swift"
    raw.setdefault("swift", {})["command"] = command
    if command.startswith("megatron"):
        _set(raw, "parallel.strategy", "megatron")
    tables = flag_tables()
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
