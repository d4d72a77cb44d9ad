"""The ms-swift backend: tunedeck's own torchrun runs ms-swift's entry modules directly,

    python -m torch.distributed.run <tunedeck flags> -m swift.cli.sft <ms-swift flags>

instead of the `swift` launcher, so per-rank log files, restarts and rendezvous stay ours (the
launcher only forwards NPROC_PER_NODE & co. to torchrun and hides the rest). Flags follow the
installed ms-swift version and are checked against its own argument table before launch.
Metrics: the agent tails ms-swift's logging.jsonl (console dicts as fallback) into
events/rank0.jsonl, the same stream the built-in trainer writes, read by the ingest parsers.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from tunedeck.core.backends.base import Backend, Monitor
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import torchrun_plan
from tunedeck.core.ingest.metrics import MetricsParser
from tunedeck.core.ingest.parsers import parse_metrics_line
from tunedeck.core.ingest.tail import RankLogTail, Tail
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.events import EventWriter, from_record
from tunedeck.core.spec import RunSpec
from tunedeck.core.swift.flags import validate
from tunedeck.core.swift.version import ASSUMED, installed_version, tuner_flag

ENTRY = {"sft": "swift.cli.sft", "pt": "swift.cli.pt", "rlhf": "swift.cli.rlhf",
         "megatron-sft": "swift.cli._megatron.sft", "megatron-pt": "swift.cli._megatron.pt"}
# what a user types for the same thing (`tunedeck export --format swift`)
CLI_FORM = {"sft": ["swift", "sft"], "pt": ["swift", "pt"], "rlhf": ["swift", "rlhf"],
            "megatron-sft": ["megatron", "sft"], "megatron-pt": ["megatron", "pt"]}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class SwiftPlanError(ValueError):
    pass


def is_megatron(spec: RunSpec) -> bool:
    return spec.swift.command.startswith("megatron")


def _b(v: bool) -> str:
    return "true" if v else "false"


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
        except OSError as e:
            raise SwiftPlanError(f"data.path: {e}") from None
        return ["--model", str(model), "--model_type", "qwen2",
                "--template", "qwen", "--check_model", "false"]
    return ["--model", mp]


def data_flags(spec: RunSpec) -> list[str]:
    d = spec.data
    datasets = [d.path] if d.path else []
    if d.format == "self_cognition":
        datasets.append("swift/self-cognition")
    out = ["--dataset", *datasets] if datasets else []
    if d.val_path:
        out += ["--val_dataset", d.val_path]
    elif d.val_split > 0:
        out += ["--split_dataset_ratio", f"{d.val_split:g}"]
    out += ["--max_length", str(d.max_length),
            "--truncation_strategy", {"drop": "delete"}.get(d.truncation, d.truncation),
            "--dataloader_num_workers", str(d.num_workers)]
    if d.packing:
        out += ["--packing", "true"]
    if d.model_name:
        out += ["--model_name", d.model_name, d.model_name]  # ms-swift wants (zh, en)
    if d.model_author:
        out += ["--model_author", d.model_author, d.model_author]
    return out


def method_flags(spec: RunSpec, version: str) -> list[str]:
    m = spec.method
    tuner = "full" if m.type == "full" else "lora"
    out = [tuner_flag(version), tuner]
    if m.type == "qlora":
        if is_megatron(spec):
            raise SwiftPlanError("method.type qlora: Megatron-SWIFT does not support QLoRA; "
                                 "use lora")
        # ms-swift has no qlora tuner: QLoRA = lora on a bitsandbytes-quantised base
        out += ["--quant_method", "bnb", "--quant_bits", str(m.quant_bits)]
        if m.quant_bits == 4:
            out += ["--bnb_4bit_quant_type", "nf4", "--bnb_4bit_use_double_quant", "true"]
    if tuner == "lora":
        out += ["--lora_rank", str(m.lora_rank), "--lora_alpha", str(m.lora_alpha),
                "--lora_dropout", f"{m.lora_dropout:g}", "--target_modules", *m.target_modules]
    return out


def parallel_flags(spec: RunSpec) -> list[str]:
    p, c = spec.parallel, spec.cluster
    out: list[str] = []
    if is_megatron(spec):
        if p.strategy not in ("megatron", "ddp"):
            raise SwiftPlanError(f"parallel.strategy {p.strategy}: megatron commands shard "
                                 "with tp/pp/cp/ep; use strategy = \"megatron\"")
        out += ["--tensor_model_parallel_size", str(p.tp),
                "--pipeline_model_parallel_size", str(p.pp),
                "--context_parallel_size", str(p.cp),
                "--expert_model_parallel_size", str(p.ep)]
        if p.sequence_parallel:
            out += ["--sequence_parallel", "true"]
        return out
    if p.strategy == "megatron":
        raise SwiftPlanError("parallel.strategy megatron needs swift.command megatron-sft or "
                             "megatron-pt")
    if p.strategy == "deepspeed":
        if p.zero_offload != "none" and p.zero_stage < 2:
            raise SwiftPlanError(f"parallel.zero_offload {p.zero_offload} needs zero_stage 2 "
                                 f"or 3 (got {p.zero_stage})")
        if p.zero_offload == "none":
            out += ["--deepspeed", f"zero{p.zero_stage}"]
        elif p.zero_stage == 2 or p.zero_offload == "all":
            out += ["--deepspeed", f"zero{p.zero_stage}_offload"]
        else:  # ZeRO-3, optimizer only: ms-swift's preset offloads parameters too
            out += ["--deepspeed", json.dumps(_zero3_optimizer_offload(), separators=(",", ":"))]
    elif p.strategy == "fsdp2":
        if p.cpu_offload:
            out += ["--fsdp", json.dumps({
                "fsdp": "full_shard auto_wrap offload",
                "fsdp_config": {"fsdp_version": 2, "reshard_after_forward": True,
                                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                "cpu_ram_efficient_loading": True,
                                "state_dict_type": "SHARDED_STATE_DICT",
                                "activation_checkpointing": True}}, separators=(",", ":"))]
        else:
            out += ["--fsdp", "fsdp2"]
    elif spec.method.type != "full" and c.nproc_per_node * c.nnodes > 1:
        # frozen base weights have no grads; DDP's unused-parameter search only costs time
        out += ["--ddp_find_unused_parameters", "false"]
    return out


def _zero3_optimizer_offload() -> dict[str, Any]:
    return {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": 3,
                                  "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                  "overlap_comm": True, "contiguous_gradients": True,
                                  "stage3_gather_16bit_weights_on_model_save": True},
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}


def train_flags(spec: RunSpec, output_dir: str) -> list[str]:
    t = spec.train
    save_steps = t.save_steps or t.max_steps  # 0 = only at the end
    if is_megatron(spec):
        from tunedeck.core.estimate.batch import data_parallel_size

        world = spec.cluster.nproc_per_node * spec.cluster.nnodes
        gbs = t.per_device_batch_size * data_parallel_size(spec, world) * t.grad_accum
        out = ["--micro_batch_size", str(t.per_device_batch_size),
               "--global_batch_size", str(gbs), "--train_iters", str(t.max_steps),
               "--lr", f"{t.learning_rate:g}", "--lr_warmup_iters", str(t.warmup_steps),
               "--lr_decay_style", t.lr_scheduler, "--weight_decay", f"{t.weight_decay:g}",
               "--clip_grad", f"{t.max_grad_norm:g}", "--seed", str(t.seed),
               "--save_steps", str(save_steps), "--output_dir", output_dir,
               "--logging_steps", "1"]
        if t.eval_steps:
            out += ["--eval_steps", str(t.eval_steps)]
        if t.gradient_checkpointing:
            out += ["--recompute_granularity", "full", "--recompute_method", "uniform",
                    "--recompute_num_layers", "1"]
        return out
    out = ["--max_steps", str(t.max_steps),
           "--per_device_train_batch_size", str(t.per_device_batch_size),
           "--gradient_accumulation_steps", str(t.grad_accum),
           "--learning_rate", f"{t.learning_rate:g}", "--weight_decay", f"{t.weight_decay:g}",
           "--warmup_steps", str(t.warmup_steps), "--lr_scheduler_type", t.lr_scheduler,
           "--max_grad_norm", f"{t.max_grad_norm:g}", "--seed", str(t.seed),
           "--save_steps", str(save_steps),
           "--gradient_checkpointing", _b(t.gradient_checkpointing),
           "--output_dir", output_dir, "--logging_steps", "1"]
    if t.save_total_limit:
        out += ["--save_total_limit", str(t.save_total_limit)]
    if t.eval_steps:
        out += ["--eval_strategy", "steps", "--eval_steps", str(t.eval_steps)]
    if t.resume_from:
        out += ["--resume_from_checkpoint", t.resume_from]
    if t.compile:
        out += ["--torch_compile", "true"]
    return out


def swift_args(spec: RunSpec, output_dir: str, version: str | None = None) -> list[str]:
    """Every ms-swift flag of a run (what follows `-m swift.cli.<command>`)."""
    version = version or installed_version() or ASSUMED
    s = spec.swift
    args = model_flags(spec)
    if spec.model.dtype != "auto":
        args += ["--torch_dtype", spec.model.dtype]
    if not is_megatron(spec):
        args += ["--attn_impl", spec.model.attn_impl]
    args += data_flags(spec) + method_flags(spec, version) + parallel_flags(spec)
    args += train_flags(spec, output_dir)
    if s.command == "rlhf":
        if not s.rlhf_type:
            raise SwiftPlanError("swift.rlhf_type is required for swift.command rlhf "
                                 "(dpo, grpo, kto, ...)")
        args += ["--rlhf_type", s.rlhf_type]
    if s.use_vllm:
        if s.rlhf_type != "grpo":
            raise SwiftPlanError("swift.use_vllm is for GRPO (swift.rlhf_type = \"grpo\")")
        # ms-swift requires an explicit mode whenever vLLM generates
        args += ["--use_vllm", "true", "--vllm_mode", s.vllm_mode]
    if spec.cluster.device == "cpu":
        if is_megatron(spec):
            raise SwiftPlanError("megatron commands need GPUs; cluster.device is cpu")
        # without --use_cpu accelerate does not pick gloo DDP and ranks train independently
        args += ["--use_cpu", "true", "--ddp_backend", "gloo"]
    elif spec.cluster.dist_backend in ("nccl", "gloo") and not is_megatron(spec):
        args += ["--ddp_backend", spec.cluster.dist_backend]
    timeout = spec.cluster.collective_timeout_s
    if timeout and not is_megatron(spec) and "--ddp_timeout" not in s.extra_args:
        # ms-swift's own default is 18,000,000 s (208 days): a hung collective never fails
        args += ["--ddp_timeout", str(timeout)]
    if not any(a in ("--report_to", "--report-to") for a in s.extra_args):
        args += ["--report_to", "none"]
    return args + list(s.extra_args)


def check_args(spec: RunSpec, args: list[str]) -> None:
    problems = validate(spec.swift.command, args)
    if problems:
        raise SwiftPlanError("ms-swift would reject this run:\n  " + "\n  ".join(problems))


def check(spec: RunSpec, local: bool) -> None:
    """Every flag checked against the installed ms-swift's own argument table."""
    check_args(spec, swift_args(spec, "OUTPUT_DIR"))


# ms-swift flags that carry a credential, and the variable read in their place when the flag is
# absent: --hub_token is `MODELSCOPE_API_TOKEN` for ModelScope (ms-swift's MSHub.try_login) and
# `HF_TOKEN` for the Hugging Face hub (use_hf: huggingface_hub takes token=None from it);
# --swanlab_token is `SWANLAB_API_KEY` (swanlab's own login). Passed so, the value never shows in
# `ps` nor in ms-swift's args.json. Other credential flags (--swanlab_secret) have no variable
# and stay in argv: the preview says `ps` shows them.
SECRET_FLAG_ENV = {"hub_token": None, "swanlab_token": "SWANLAB_API_KEY"}
# every ms-swift flag that holds a credential (its other flags with a credential word in their
# name, such as --teacher_tag_key, hold none): what `tunedeck import` keeps out of a spec
CREDENTIAL_FLAGS = frozenset({*SECRET_FLAG_ENV, "swanlab_secret", "api_key"})
HUB_TOKEN_VARS = "MODELSCOPE_API_TOKEN (HF_TOKEN with --use_hf)"


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
                value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") \
                    else "true"
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
            var = SECRET_FLAG_ENV[canon] or ("HF_TOKEN" if uses_hf_hub(spec, args)
                                             else "MODELSCOPE_API_TOKEN")
            if value:
                env[var] = value       # the flag wins over the variable, as in ms-swift
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

    def __init__(self, run: RunDir, output_dir: Path, log_rank: int):
        self.output_dir = output_dir
        self.writer = EventWriter(run.path, 0, dedupe_steps=True)
        self.tail = RankLogTail(run, log_rank)
        self.jsonl: Tail | None = None
        self.parser = MetricsParser()       # logging.jsonl and console dicts carry their step
        self.pending: list[tuple[float, dict[str, Any]]] = []
        self.finished = False

    def _discover(self, lines: list[str]) -> None:
        for line in lines:
            found = None
            for m in ANNOUNCE.finditer(line):
                found = Path(m.group(1))
            if found:
                self._use(found)
        if self.jsonl is None or not self.jsonl.path.exists():
            # restarts make new v<N>-<time> folders: follow the newest
            found = sorted(self.output_dir.glob("v*-*/logging.jsonl"),
                           key=lambda p: p.stat().st_mtime)
            direct = self.output_dir / "logging.jsonl"
            if found:
                self._use(found[-1])
            elif direct.exists():
                self._use(direct)

    def _use(self, path: Path) -> None:
        if self.jsonl is None or path != self.jsonl.path:
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
    return [SwiftLogMonitor(run, run.output_dir(spec), log_rank)]


def cli_form(spec: RunSpec, output_dir: str) -> tuple[dict[str, str], list[str]]:
    """The plain `NPROC_PER_NODE=.. swift sft ...` command users know (export)."""
    c = spec.cluster
    env = {"NPROC_PER_NODE": str(c.nproc_per_node)}
    if c.nnodes > 1:
        env.update(NNODES=str(c.nnodes), NODE_RANK=str(c.node_rank),
                   MASTER_ADDR=c.master_addr, MASTER_PORT=str(c.master_port))
    if c.gpus:
        env["CUDA_VISIBLE_DEVICES"] = c.gpus
    env.update(swift_env(spec))
    env.update(spec.env)
    args, secret_env = secret_flags_to_env(spec, swift_args(spec, output_dir))
    env.update(secret_env)
    return env, [*CLI_FORM[spec.swift.command], *args]


BACKEND = Backend("swift", build_plan, check, monitors)
