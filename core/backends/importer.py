"""`tunedeck import 'COMMAND'`: a pasted launch command becomes a spec.

The command is split with shlex and never run, so a word still holding `$VAR` is refused by
name. Variables in front (NPROC_PER_NODE=.. CUDA_VISIBLE_DEVICES=..) become cluster keys, and
the generic launchers (`torchrun`, `python -m torch.distributed.run|launch`, `accelerate
launch`, `deepspeed`, `python script.py`) become tunedeck's torchrun with the same processes
and nodes. What they run, and every other command, is read by the backend it belongs to
(`Backend.importer`, core/backends/importing.py): its own programs (`swift sft`,
`llamafactory-cli train`), `python -m` aliases of them, and the modules or files a launcher
runs; a script no backend claims goes to the catch-all (the script backend).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from tunedeck.core.backends import BACKENDS
from tunedeck.core.backends.importing import (
    Cluster,
    CommandImportError,
    Env,
    Imported,
    Importer,
    read_config,
)
from tunedeck.core.spec import MASK, SpecError, is_secret_name, mask_argv

__all__ = ["CommandImportError", "Imported", "import_command"]

ENV_TO_CLUSTER = {
    "NPROC_PER_NODE": ("nproc_per_node", int),
    "NNODES": ("nnodes", int),
    "NODE_RANK": ("node_rank", int),
    "MASTER_ADDR": ("master_addr", str),
    "MASTER_PORT": ("master_port", int),
    "CUDA_VISIBLE_DEVICES": ("gpus", str),
}
LAUNCHERS = ("torchrun", "accelerate launch", "deepspeed", "python -m torch.distributed.run")
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


_SHELL_VAR = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|\()")


def _importers() -> list[Importer]:
    """Every backend's importer, the catch-all last."""
    found = [b.importer for b in BACKENDS.values() if b.importer is not None]
    return sorted(found, key=lambda i: i.catch_all)


def _known() -> str:
    programs = [p for i in _importers() for p in i.programs]
    return ", ".join([*programs, *LAUNCHERS])


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
    cluster: Cluster = {}
    env: Env = {}
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
    _dispatch(out, words, cluster, env)
    if cluster:
        if cluster.get("gpus") or cluster.get("nproc_per_node"):
            cluster.setdefault("device", "cuda")
        out.raw.setdefault("cluster", {}).update(cluster)
    if env:
        out.raw["env"] = env
    backend = BACKENDS.get(str(out.raw.get("backend", "")))
    if backend is not None and backend.importer is not None:
        backend.importer.finish(out)
    try:
        out.spec()
    except SpecError as e:
        raise CommandImportError(f"the imported spec is invalid: {e}") from None
    return out


def _dispatch(out: Imported, words: list[str], cluster: Cluster, env: Env) -> None:
    """The program in front: a generic launcher, or a backend's own command."""
    prog = words[0].rsplit("/", 1)[-1]
    rest = words[1:]
    if prog.startswith("python"):
        module = rest[1] if rest[:1] == ["-m"] and len(rest) > 1 else ""
        alias = next((i.aliases[module] for i in _importers() if module in i.aliases), "")
        if alias:
            prog, rest = alias, rest[2:]
        elif module in ("torch.distributed.run", "torch.distributed.launch"):
            if module.endswith("launch"):
                out.notes.append(
                    "torch.distributed.launch is deprecated; tunedeck runs "
                    "torch.distributed.run (torchrun)"
                )
            prog, rest = "torchrun", rest[2:]
        elif module:
            # one python process running a backend's entry module directly
            cluster.setdefault("nproc_per_node", 1)
            if not any(
                i.target(out, module, rest[2:], cluster, env, "python")
                for i in _importers()
                if not i.catch_all
            ):
                raise CommandImportError(
                    f"cannot tell what `{' '.join(words[:3])}` launches; expected {_known()}"
                )
            return
        elif rest and rest[0].endswith(".py"):
            prog = "torchrun"
            out.notes.append("a plain `python script.py` runs as one torchrun rank")
            cluster.setdefault("nproc_per_node", 1)
        else:
            raise CommandImportError(
                f"cannot tell what `{' '.join(words[:3])}` launches; expected {_known()}"
            )
    if prog == "torchrun":
        _torchrun(out, rest, cluster, env)
        return
    if prog == "accelerate":
        _accelerate(out, rest, cluster, env)
        return
    if prog == "deepspeed":
        _deepspeed(out, rest, cluster, env)
        return
    for imp in _importers():
        if prog in imp.programs and imp.command is not None:
            imp.command(out, prog, rest, cluster, env)
            return
    raise CommandImportError(f"`{prog}` is not a launcher tunedeck knows ({_known()})")


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
    out: Imported, words: list[str], module: str, cluster: Cluster, env: Env, launcher: str
) -> None:
    """What a launcher runs, read by the backend that claims it."""
    if not module and not words:
        raise CommandImportError(f"{launcher} command without a script or -m module")
    for imp in _importers():
        if imp.target(out, module, words, cluster, env, launcher):
            return
    raise CommandImportError(f"{launcher}: no backend runs {module or words[0]}")


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


def _torchrun(out: Imported, words: list[str], cluster: Cluster, env: Env) -> None:
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


def _accelerate(out: Imported, words: list[str], cluster: Cluster, env: Env) -> None:
    if words[:1] != ["launch"]:
        raise CommandImportError(
            "`accelerate` without `launch`: tunedeck imports accelerate launch commands"
        )
    flags, module, target = _launcher_flags(words[1:], _ACCEL_VALUE, _ACCEL_BOOL, "accelerate")
    conf: dict[str, Any] = {}
    if flags.get("config_file"):
        conf = read_config(flags["config_file"], "accelerate --config_file")
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
            f"; not carried over: {', '.join(left)} (give the trainer's own "
            "DeepSpeed / FSDP / dtype settings instead)"
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


def _deepspeed(out: Imported, words: list[str], cluster: Cluster, env: Env) -> None:
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
