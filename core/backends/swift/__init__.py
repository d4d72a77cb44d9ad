"""The ms-swift backend: tunedeck's own torchrun runs ms-swift's entry modules directly,

    python -m torch.distributed.run <tunedeck flags> -m swift.cli.sft <ms-swift flags>

instead of the `swift` launcher, so per-rank log files, restarts and rendezvous stay ours (the
launcher only forwards NPROC_PER_NODE & co. to torchrun and hides the rest). Only the keys the
spec sets become flags (core/backends/swift/keymap.py, the table `tunedeck import` reads the other
way); for the rest ms-swift's own defaults apply, and swift.extra_args follow as written.
Flags follow the installed ms-swift version and are checked against its own argument table
before launch.
Metrics: the agent tails ms-swift's logging.jsonl (console dicts as fallback) into
events/rank0.jsonl, the same stream the built-in trainer writes, read by the ingest parsers.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

from tunedeck.core.backends.base import Backend, Exported, Monitor, Restart
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import launcher_env, torchrun_plan
from tunedeck.core.ingest.dataphase import DataPhase
from tunedeck.core.ingest.metrics import MetricsParser
from tunedeck.core.ingest.parsers import parse_metrics_line
from tunedeck.core.ingest.tail import RankLogTail, Tail
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.rundir.events import EventWriter, from_record
from tunedeck.core.spec import RunSpec, get_value, is_set
from tunedeck.core.backends.swift import run_estimate
from tunedeck.core.backends.swift.flags import FlagTableError, flag_tables, validate
from tunedeck.core.backends.swift.importer import IMPORTER
from tunedeck.core.backends.swift.keymap import BY_KEY, MODEL_FROM, SECRET_FLAG_ENV
from tunedeck.core.backends.swift.version import ASSUMED, installed_version, tuner_flag

ENTRY = {
    "sft": "swift.cli.sft",
    "pt": "swift.cli.pt",
    "rlhf": "swift.cli.rlhf",
    "megatron-sft": "swift.cli._megatron.sft",
    "megatron-pt": "swift.cli._megatron.pt",
    "megatron-rlhf": "swift.cli._megatron.rlhf",
}
# what a user types for the same thing (`tunedeck export --format swift`)
CLI_FORM = {
    "sft": ["swift", "sft"],
    "pt": ["swift", "pt"],
    "rlhf": ["swift", "rlhf"],
    "megatron-sft": ["megatron", "sft"],
    "megatron-pt": ["megatron", "pt"],
    "megatron-rlhf": ["megatron", "rlhf"],
}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class SwiftPlanError(ValueError):
    pass


def is_megatron(spec: RunSpec) -> bool:
    return spec.swift.command.startswith("megatron")


def model_flags(spec: RunSpec) -> list[str]:
    mp = spec.model.path
    if mp.startswith("builtin:"):
        from tunedeck.core.demo import BUILTIN_TINY, tiny_model_dir

        if mp != BUILTIN_TINY:
            raise SwiftPlanError(f"model.path: unknown built-in model {mp!r}")
        if not spec.data.path:
            raise SwiftPlanError("data.path: the built-in tiny model is built from the data")
        # built by the agent before torchrun starts (a plan builds nothing); a fresh random
        # model matches several of ms-swift's model and template types; and --check_model
        # false skips a hub lookup that takes ~24 s to fail offline
        try:
            model = tiny_model_dir(spec.data.path)
        except OSError as e:  # a DataFileError's sentence names data.path already
            said = str(e)
            raise SwiftPlanError(
                said if said.startswith("data.path") else f"data.path: {said}"
            ) from None
        return [
            "--model",
            str(model),
            "--model_type",
            "qwen2",
            "--template",
            "qwen",
            "--check_model",
            "false",
        ]
    return ["--model", mp]


def datasets(spec: RunSpec) -> list[str]:
    """--dataset's words: data.path, then data.datasets as written, then ms-swift's
    self-cognition set when data.format asks for it and no entry names it already."""
    d = spec.data
    out = ([d.path] if d.path else []) + list(d.datasets)
    if d.format == "self_cognition" and not any(
        x.split("#")[0] == "swift/self-cognition" for x in out
    ):
        out.append("swift/self-cognition")
    return out


def _strategy_flags(spec: RunSpec) -> list[str]:
    p = spec.parallel
    if is_megatron(spec):
        if p.strategy not in ("megatron", "ddp"):
            raise SwiftPlanError(
                f"parallel.strategy {p.strategy}: megatron commands shard "
                'with tp/pp/cp/ep; use strategy = "megatron"'
            )
        return []
    if p.strategy == "megatron":
        raise SwiftPlanError(
            "parallel.strategy megatron needs swift.command megatron-sft, "
            "megatron-pt or megatron-rlhf"
        )
    if p.strategy == "deepspeed":
        if p.zero_offload != "none" and p.zero_stage < 2:
            raise SwiftPlanError(
                f"parallel.zero_offload {p.zero_offload} needs zero_stage 2 "
                f"or 3 (got {p.zero_stage})"
            )
        if p.zero_offload == "none":
            return ["--deepspeed", f"zero{p.zero_stage}"]
        if p.zero_stage == 2 or p.zero_offload == "all":
            return ["--deepspeed", f"zero{p.zero_stage}_offload"]
        # ZeRO-3, optimizer only: ms-swift's preset offloads parameters too
        return ["--deepspeed", json.dumps(_zero3_optimizer_offload(), separators=(",", ":"))]
    if p.strategy == "fsdp2":
        if p.cpu_offload:
            return [
                "--fsdp",
                json.dumps(
                    {
                        "fsdp": "full_shard auto_wrap offload",
                        "fsdp_config": {
                            "fsdp_version": 2,
                            "reshard_after_forward": True,
                            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                            "cpu_ram_efficient_loading": True,
                            "state_dict_type": "SHARDED_STATE_DICT",
                            "activation_checkpointing": True,
                        },
                    },
                    separators=(",", ":"),
                ),
            ]
        return ["--fsdp", "fsdp2"]
    return []


def _zero3_optimizer_offload() -> dict[str, Any]:
    return {
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }


def _method_flags(spec: RunSpec, version: str) -> list[str]:
    m = spec.method
    if m.type == "qlora":
        if is_megatron(spec):
            raise SwiftPlanError(
                "method.type qlora: Megatron-SWIFT does not support QLoRA; use lora"
            )
        # ms-swift has no qlora tuner: QLoRA = lora on a bitsandbytes-quantised base (its
        # defaults are nf4 with double quantisation)
        return [
            tuner_flag(version),
            "lora",
            "--quant_method",
            "bnb",
            "--quant_bits",
            str(m.quant_bits),
        ]
    if is_set(spec, "method.type"):
        return [tuner_flag(version), m.type]
    return []


def _megatron_batch(spec: RunSpec) -> list[str]:
    """--global_batch_size from train.grad_accum (Megatron counts the whole step)."""
    if not is_set(spec, "train.grad_accum"):
        return []
    from tunedeck.core.estimate.batch import data_parallel_size

    t = spec.train
    world = spec.cluster.nproc_per_node * spec.cluster.nnodes
    return [
        "--global_batch_size",
        str(t.per_device_batch_size * data_parallel_size(spec, world) * t.grad_accum),
    ]


def swift_args(spec: RunSpec, output_dir: str | None, version: str | None = None) -> list[str]:
    """Every ms-swift flag of a run (what follows `-m swift.cli.<command>`): the flags of the
    keys the spec sets (core/backends/swift/keymap.py), then swift.extra_args as written. A key the spec
    does not set emits nothing, so ms-swift's own default applies. `output_dir` None: none
    (an export for the user's own shell, where ms-swift picks its folder)."""
    from tunedeck.core.backends.swift.keymap import KEYS, emits, encode

    version = version or installed_version() or ASSUMED
    s, command = spec.swift, spec.swift.command
    extra = {w[2:].partition("=")[0] for w in s.extra_args if w.startswith("--")}

    def wanted(flag: str) -> bool:  # extra_args win: they are what the user wrote
        return flag not in extra

    # ms-swift reads the model from a checkpoint's args.json (--adapters, --ckpt_dir) and
    # Megatron from its own checkpoint (--mcore_model): then no --model is theirs to add
    own_model = not is_set(spec, "model.path") and bool(extra & MODEL_FROM)
    args = [] if own_model else model_flags(spec)
    ds = datasets(spec)
    if ds and wanted("dataset"):
        args += ["--dataset", *ds]
    for kf in KEYS:
        flag = kf.flag_for(command)
        if not flag or not wanted(flag) or not is_set(spec, kf.key):
            continue
        value = get_value(spec, kf.key)
        if kf.key == "train.resume_from" and value == "auto":  # a folder to ms-swift
            found = resume_point(value, Path(output_dir), 0) if output_dir else None
            args += [f"--{flag}", str(found)] if found else []
        elif emits(kf, value):
            args += [f"--{flag}", *encode(kf, value)]
    for key, flag in (("data.model_name", "model_name"), ("data.model_author", "model_author")):
        value = get_value(spec, key)
        if value and wanted(flag):
            args += [f"--{flag}", value, value]  # ms-swift wants (zh, en)
    args += _method_flags(spec, version) + _strategy_flags(spec)
    if is_megatron(spec):
        args += _megatron_batch(spec) if wanted("global_batch_size") else []
        if spec.train.gradient_checkpointing and wanted("recompute_granularity"):
            args += [
                "--recompute_granularity",
                "full",
                "--recompute_method",
                "uniform",
                "--recompute_num_layers",
                "1",
            ]
    if spec.cluster.device == "cpu":
        if is_megatron(spec):
            raise SwiftPlanError("megatron commands need GPUs; cluster.device is cpu")
        # without --use_cpu accelerate does not pick gloo DDP and ranks train independently
        if wanted("use_cpu"):
            args += ["--use_cpu", "true"]
        if wanted("ddp_backend"):
            args += ["--ddp_backend", "gloo"]
    elif spec.cluster.dist_backend == "gloo" and wanted("ddp_backend"):
        # nccl on GPUs is what ms-swift picks itself (and what resolve writes into a run's
        # spec.toml, so a clone must not turn it into a flag); gloo there is a choice
        args += ["--ddp_backend", "gloo"]
    if output_dir and wanted("output_dir"):
        args += ["--output_dir", output_dir]
    return args + list(s.extra_args)


def check_args(spec: RunSpec, args: list[str]) -> None:
    problems = validate(spec.swift.command, args)
    if problems:
        raise SwiftPlanError("ms-swift would reject this run: " + "; ".join(problems))


def check(spec: RunSpec, local: bool) -> None:
    """Every flag checked against the installed ms-swift's own argument table."""
    check_args(spec, swift_args(spec, "OUTPUT_DIR"))


# ms-swift flags that carry a credential, and the variable read in their place when the flag is
# absent: --hub_token is `MODELSCOPE_API_TOKEN` for ModelScope (ms-swift's MSHub.try_login) and
# `HF_TOKEN` for the Hugging Face hub (use_hf: huggingface_hub takes token=None from it);


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def uses_hf_hub(spec: RunSpec, args: list[str]) -> bool:
    """Whether ms-swift will talk to the Hugging Face hub (--use_hf, or USE_HF in the spec's or
    the launching environment) rather than ModelScope."""
    import os

    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in ("--use_hf", "--use-hf"):
            if not eq:
                value = (
                    args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else "true"
                )
            return _truthy(value)
    return _truthy(spec.env.get("USE_HF", os.environ.get("USE_HF")))


def secret_flags_to_env(spec: RunSpec, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """(args without the credential flags ms-swift can read from a variable, those variables)."""
    out: list[str] = []
    env: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        canon = name.lstrip("-").replace("-", "_")
        if a.startswith("--") and canon in SECRET_FLAG_ENV:
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("-"):
                    value = args[i + 1]
                    i += 1
                else:
                    value = ""
            var = SECRET_FLAG_ENV[canon] or (
                "HF_TOKEN" if uses_hf_hub(spec, args) else "MODELSCOPE_API_TOKEN"
            )
            if value:
                env[var] = value  # the flag wins over the variable, as in ms-swift
            i += 1
            continue
        out.append(a)
        i += 1
    return out, env


def swift_env(spec: RunSpec) -> dict[str, str]:
    env: dict[str, str] = {}
    if spec.model.path.startswith("builtin:"):
        env.update(OFFLINE_ENV)  # everything is local; never wait on a hub
    if is_megatron(spec):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # what `megatron sft` sets for TP overlap
    return env


def build_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    args, secret_env = secret_flags_to_env(spec, swift_args(spec, str(run.output_dir(spec))))
    plan = torchrun_plan(spec, run, ["-m", ENTRY[spec.swift.command], *args], swift_env(spec))
    for node in plan.nodes:
        node.env.update(secret_env)
    return plan


# -- metrics -----------------------------------------------------------------------------

CONSOLE_GRACE_S = 10.0  # how long console dicts wait for logging.jsonl to be found
ANNOUNCE = re.compile(r"The logging file will be saved in: (\S+logging\.jsonl)")


class SwiftLogMonitor:
    """Tails ms-swift's logging.jsonl into events/rank0.jsonl; console dicts of the logging
    rank are the fallback when no logging.jsonl turns up (e.g. a PAI job, a killed rank)."""

    def __init__(
        self, run: RunDir, output_dir: Path, log_rank: int, timeout_s: float | None = None
    ):
        self.output_dir = output_dir
        self.writer = EventWriter(run.path, 0, dedupe_steps=True)
        self.tail = RankLogTail(run, log_rank)
        self.jsonl: Tail | None = None
        self.announced: Path | None = None  # what the logging rank said it writes
        self.ended: set[Path] = set()  # version folders' files of ended attempts
        self.parser = MetricsParser()  # logging.jsonl and console dicts carry their step
        self.pending: list[tuple[float, dict[str, Any]]] = []
        self.finished = False
        # its dataset Map/Packing bars: the data stage's phase, warned against the timeout
        self.data = DataPhase(timeout_s)

    def _discover(self, lines: list[str]) -> None:
        for line in lines:
            for m in ANNOUNCE.finditer(line):
                self.announced = Path(m.group(1))
        if self.announced is not None:
            # the newest attempt's own file, followed even before ms-swift creates it: the
            # older attempt's file still exists and must not win meanwhile
            self._use(self.announced)
        elif self.jsonl is None or not self.jsonl.path.exists():
            # restarts make new v<N>-<time> folders: follow the newest, never one that an
            # attempt before has ended
            found = sorted(
                (p for p in self.output_dir.glob("v*-*/logging.jsonl") if p not in self.ended),
                key=lambda p: p.stat().st_mtime,
            )
            direct = self.output_dir / "logging.jsonl"
            if found:
                self._use(found[-1])
            elif direct.exists():
                self._use(direct)

    def _use(self, path: Path) -> None:
        if self.jsonl is None or path != self.jsonl.path:
            logging.getLogger("tunedeck.agent").info("ms-swift's metrics: %s", path)
            self.jsonl = Tail(path)

    def _read_jsonl(self) -> None:
        if self.jsonl is None or not self.jsonl.path.exists():
            return
        for raw in self.jsonl.records():
            rec = self.parser.normalise("dict", raw)
            ev = from_record(rec) if rec else None
            if ev:
                self.writer.emit(**ev)
            elif raw.get("last_model_checkpoint"):  # the summary line at the end of training
                step = raw.get("global_step") or self.writer.last_step
                self.writer.emit("checkpoint", step=step, path=raw["last_model_checkpoint"])
                self.finished = True

    def tick(self, now: float, new_events: list) -> None:
        lines = self.tail.logical_lines()
        phase = self.data.feed([*lines, *self.tail.redraws()], now)
        if phase is not None:
            self.writer.emit("phase", step=self.writer.last_step, **phase)
            if "warning" in phase:
                logging.getLogger("tunedeck.agent").warning("rank 0: %s", phase["warning"])
        self._discover(lines)
        if self.jsonl is not None:
            self.pending.clear()
            self._read_jsonl()
            return
        for line in lines:
            got = parse_metrics_line(line)
            rec = self.parser.normalise(*got) if got and got[0] == "dict" else None
            ev = from_record(rec) if rec else None
            if ev:
                self.pending.append((now, ev))
        while self.pending and now - self.pending[0][0] >= CONSOLE_GRACE_S:
            self.writer.emit(**self.pending.pop(0)[1])

    def restarted(self, step: int) -> None:
        """The attempt that ended is read to its last line; the next one writes its own
        logging.jsonl, whose repeats of earlier steps replace them."""
        self.tick(time.time(), [])
        for _, ev in self.pending:
            self.writer.emit(**ev)
        self.pending.clear()
        self.writer.restart_at(step)
        self.announced = None
        if self.jsonl is not None and self.jsonl.path.parent != self.output_dir:
            self.ended.add(self.jsonl.path)  # the next attempt writes a folder of its own
            self.jsonl = None

    def close(self, new_events: list) -> None:
        self.tick(time.time(), new_events)
        for _, ev in self.pending:
            self.writer.emit(**ev)
        self.pending.clear()
        if self.finished:
            self.writer.emit("end", step=self.writer.last_step, reason="completed")
        self.writer.close()


def monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    """Only the node holding ms-swift's logging rank (world rank 0; the last rank for
    Megatron) tails it."""
    c = spec.cluster
    world = max(c.nproc_per_node, 1) * c.nnodes
    log_rank = world - 1 if is_megatron(spec) else 0
    if log_rank // max(c.nproc_per_node, 1) != c.node_rank:
        return []
    # ms-swift's own --ddp_timeout default is far beyond any data stage: only a set one counts
    timeout = spec.cluster.collective_timeout_s or None
    return [SwiftLogMonitor(run, run.output_dir(spec), log_rank, timeout)]


def cli_form(spec: RunSpec, output_dir: str | None) -> Exported:
    """The plain `NPROC_PER_NODE=.. swift sft ...` command users know (export); no
    --output_dir unless the spec names one (ms-swift's own folder, as the user had it)."""
    c = spec.cluster
    env = {"NPROC_PER_NODE": str(c.nproc_per_node)}
    env.update(launcher_env(c))
    env.update(swift_env(spec))
    env.update(spec.env)
    args, secret_env = secret_flags_to_env(spec, swift_args(spec, output_dir))
    env.update(secret_env)
    return Exported(env, [*CLI_FORM[spec.swift.command], *args])


RESUME_FLAG = "--resume_from_checkpoint"


def restart(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    """A restart continues from the last checkpoint ms-swift wrote (its next version folder
    holds the new attempt), passed as --resume_from_checkpoint in place of any the plan had;
    on several nodes the head's reading, which every node follows (core/supervisor/restarts)."""
    if is_megatron(spec):  # no such flag there: Megatron loads its own checkpoint format
        return Restart(
            None,
            "from step 0 (a Megatron run resumes through its own flags: "
            "--mcore_model CHECKPOINT --finetune false in swift.extra_args)",
        )
    return Restart.at(
        resume_point(spec.train.resume_from, run.output_dir(spec), attempt), RESUME_FLAG
    )


def requirements(spec: RunSpec) -> list[tuple[str, str, str]]:
    req = [("ms-swift", "3.0", "--tuner_type/--train_type flags")]
    if spec.swift.use_vllm:
        req.append(("vllm", "0.8", "swift.use_vllm"))
    return req


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of the last `--flag V` / `--flag=V` in argv (what argparse keeps)."""
    found = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
    return found


def user_output_dir(spec: RunSpec) -> str | None:
    """An --output_dir the user put in swift.extra_args (it wins over tunedeck's)."""
    return flag_value(list(spec.swift.extra_args), "--output_dir")


def speed_flags(spec: RunSpec) -> list[dict]:
    """ms-swift switches this run does not use yet and the installed ms-swift has (none for
    Megatron-SWIFT, which has its own)."""
    if spec.swift.command.startswith("megatron"):
        return []
    from tunedeck.core.backends.swift.speed import speed_flags as installed_speed_flags

    try:
        return installed_speed_flags(swift_args(spec, None), spec.swift.command)
    except (ValueError, FlagTableError):  # a spec the plan refuses gets no advice here
        return []


# tunedeck's dtype names → ms-swift's --torch_dtype
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def merge_command(adapter: Path, out: Path, dtype: str) -> list[str]:
    """`swift export --adapters CKPT --merge_lora true` as ms-swift's users run it (its
    launcher runs this module): the base comes from the args.json ms-swift saved beside the
    adapter, the tokenizer and template go with the merged weights."""
    return [
        sys.executable,
        "-m",
        "swift.cli.export",
        "--adapters",
        str(adapter),
        "--merge_lora",
        "true",
        "--output_dir",
        str(out),
        "--torch_dtype",
        TORCH_DTYPES[dtype],
    ]


def warm() -> str:
    """Read the installed ms-swift's flag table (a subprocess the first time per installed
    version, then a file cache): '' or why it could not be read."""
    try:
        flag_tables()
    except FlagTableError as e:
        return f"ms-swift's flags could not be read: {e}"
    return ""


BACKEND = Backend(
    "swift",
    build_plan,
    check,
    monitors,
    restart,
    requirements=requirements,
    user_output_dir=user_output_dir,
    importer=IMPORTER,
    exports={"swift": cli_form},
    checkpoint_glob_prefix="v*-*/",
    merge_command=merge_command,
    as_run=run_estimate.as_run,
    length_words=run_estimate.length_words,
    resolve_for_estimate=True,
    run_settings=run_estimate.run_settings,
    run_defaults=run_estimate.run_defaults,
    length_is_bound=run_estimate.length_is_bound,
    length_unless_steps=run_estimate.length_unless_steps,
    speed_flags=speed_flags,
    own_keys=frozenset(BY_KEY),
    warm=warm,
    warm_note="reading the installed ms-swift's flags (once per version, up to ~10 s)…",
)
