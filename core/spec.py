"""RunSpec: everything that defines a training run, loaded from TOML and validated.

Each option is declared once, as a dataclass field with its help, choices and bounds in the
field metadata. The same declaration drives TOML loading, `--set` overrides, validation messages
and the compose screen's form fields (`when`: which backend/strategy/... an option applies to;
`group`: its form section), so they never drift apart.

Errors name the dotted key and, when it came from a file, the file and line.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.backend_traits import NAMES as BACKEND_NAMES
from tunedeck.core.backend_traits import TRAITS as BACKEND_TRAITS
from tunedeck.core.backend_traits import traits_of


class SpecError(ValueError):
    """A spec that cannot be used. `problems` holds one line per bad key."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        where = f" {source}" if source and not source.startswith("<") else ""
        super().__init__(f"invalid run spec{where}:\n  " + "\n  ".join(problems))


def opt(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: tuple | None = None,
    min: float | None = None,
    max: float | None = None,
    factory: Any = None,
    when: dict[str, Any] | None = None,
    group: str | None = None,
) -> Any:
    """`min`/`max`: inclusive bounds of a number (every int and float option declares both;
    floats are also always finite: no nan, no inf).
    `when`: {dotted key: allowed values (a tuple) or a predicate}; the option matters only
    when every listed key agrees (the form hides it otherwise; loading ignores it).
    `group`: the form section, when not the one of its table (GROUP_OF_TABLE)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "when": when, "group": group}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# -- bounds ----------------------------------------------------------------------------------

INT32 = 2**31 - 1  # counts that reach ms-swift / Megatron / torch as C ints
SEED_MAX = 2**32 - 1  # numpy's seed range (torch takes more; ms-swift seeds numpy too)
DAY_S = 86400.0
# Linux's MAX_ARG_STRLEN: one argument or one NAME=VALUE of a new process, its NUL included;
# a longer one makes exec fail (E2BIG), which crashed the agent
ARG_MAX_BYTES = 131072
# all of a new process's arguments and environment share ARG_MAX (2 MiB on most systems): the
# spec's variables get at most half, the inherited environment and the command the rest
ENV_TOTAL_BYTES = 1 << 20
RESERVED_ENV = "TUNEDECK_"  # the run's id, folder and attempt: set by tunedeck for every rank


# -- applicability (`when=`) -----------------------------------------------------------------

# backends that read the model/data/method/train tables
TRAINERS = ("builtin", "swift", "llamafactory")
LORA = ("lora", "qlora")


def _multi_node(n: int) -> bool:
    return n > 1


@dataclass
class ModelSpec:
    path: str = opt(
        "builtin:tiny-qwen2",
        help="Model directory or hub id; builtin:tiny-qwen2 "
        "builds a tiny random Qwen2 for demos and tests",
    )
    dtype: str = opt(
        "auto",
        help="Weights/compute dtype; auto = bf16 on GPUs that support it, fp32 on CPU",
        choices=("auto", "float32", "bfloat16", "float16"),
        when={"backend": TRAINERS},
    )
    # transformers' attn_implementation names, which ms-swift's --attn_impl takes too (its
    # own alias flash_attn is imported into swift.extra_args as written)
    attn_impl: str = opt(
        "sdpa",
        help="Attention kernel",
        choices=("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention"),
        when={"backend": TRAINERS},
    )


@dataclass
class DataSpec:
    path: str = opt(
        "",
        help="Training data (.jsonl or .json; see data.format); relative "
        "paths are resolved from the spec file's folder",
    )
    datasets: list[str] = opt(
        help="ms-swift datasets, in order, each as written: hub ids with "
        "#N subsets and :split, or files (resolved from the spec file's "
        "folder when they exist or look like paths); after data.path",
        factory=list,
        when={"backend": ("swift",)},
    )
    val_datasets: list[str] = opt(
        help="ms-swift eval datasets (--val_dataset), each as written",
        factory=list,
        when={"backend": ("swift",)},
    )
    max_length: int = opt(
        128,
        help="Tokens per sample; longer samples are truncated",
        min=8,
        max=1 << 24,
        when={"backend": TRAINERS},
    )
    num_workers: int = opt(
        0, help="DataLoader worker processes per rank", min=0, max=512, when={"backend": TRAINERS}
    )
    format: str = opt(
        "auto",
        help="Row format; auto detects it from the first row",
        choices=("auto", "messages", "query_response", "alpaca", "self_cognition"),
        when={"backend": TRAINERS},
    )
    val_split: float = opt(
        0.0,
        help="Rows held out for eval: a fraction below 1, a row count from 1 up (0 = none)",
        min=0.0,
        max=float(INT32),
        when={"backend": TRAINERS},
    )
    val_path: str = opt(
        "", help="Separate eval file; overrides data.val_split", when={"backend": TRAINERS}
    )
    truncation: str = opt(
        "right",
        help="What to do with samples over max_length",
        choices=("right", "left", "drop"),
        when={"backend": TRAINERS},
    )
    skip_bad_rows: bool = opt(
        False,
        help="Skip malformed rows (with a warning) instead of failing with file:line",
        when={"backend": ("builtin",)},
    )
    packing: bool = opt(
        False, help="Pack samples into full-length rows (padding-free)", when={"backend": TRAINERS}
    )
    model_name: str = opt(
        "",
        help="Self-cognition: the name the model should give itself",
        when={"backend": TRAINERS, "data.format": ("self_cognition",)},
    )
    model_author: str = opt(
        "",
        help="Self-cognition: the author the model should name",
        when={"backend": TRAINERS, "data.format": ("self_cognition",)},
    )


# method.fp8_base's GPUs: fp8 matrix units arrived with compute capability 8.9 (Ada, Hopper);
# preflight checks it before launch, the trainer again on the rank's own device
FP8_MIN_CC = (8, 9)


@dataclass
class MethodSpec:
    type: str = opt(
        "lora",
        help="Fine-tuning method",
        choices=("full", "lora", "qlora"),
        when={"backend": TRAINERS},
    )
    lora_rank: int = opt(
        8, help="LoRA rank r", min=1, max=1 << 16, when={"backend": TRAINERS, "method.type": LORA}
    )
    lora_alpha: int = opt(
        16,
        help="LoRA alpha (scaling = alpha / r)",
        min=1,
        max=1 << 20,
        when={"backend": TRAINERS, "method.type": LORA},
    )
    lora_dropout: float = opt(
        0.0,
        help="Dropout on the LoRA branch",
        min=0.0,
        max=1.0,
        when={"backend": TRAINERS, "method.type": LORA},
    )
    target_modules: list[str] = opt(
        help='Modules LoRA adapts; ["all-linear"] for every linear layer but the output head',
        factory=lambda: ["all-linear"],
        when={"backend": TRAINERS, "method.type": LORA},
    )
    quant_bits: int = opt(
        4,
        help="QLoRA: bits of the frozen base weights",
        choices=(4, 8),
        when={"backend": TRAINERS, "method.type": ("qlora",)},
    )
    fp8_base: bool = opt(
        False,
        help="LoRA on fp8 copies of the frozen base weights (GPUs "
        "with fp8 units: H100, H200, L40S...): their matmuls ~1.6x faster, "
        "each product off by ~4 % (row-wise scales); off = bf16 products",
        when={"backend": ("builtin",), "method.type": ("lora",)},
    )
    merge_lora: bool = opt(
        False,
        help="Also save the base model with the adapter merged in",
        when={"backend": ("builtin",), "method.type": LORA},
        group="checkpoints",
    )


@dataclass
class TrainSpec:
    max_steps: int = opt(
        100, help="Optimizer steps to run", min=1, max=INT32, when={"backend": TRAINERS}
    )
    num_epochs: float = opt(
        0.0,
        help="Passes over the data (ms-swift --num_train_epochs); "
        "0 = not set: train.max_steps, or ms-swift's default",
        min=0.0,
        max=1e6,
        when={"backend": ("swift",)},
    )
    per_device_batch_size: int = opt(
        4, help="Samples per rank per micro-step", min=1, max=1 << 20, when={"backend": TRAINERS}
    )
    grad_accum: int = opt(
        1,
        help="Micro-steps accumulated per optimizer step",
        min=1,
        max=1 << 20,
        when={"backend": TRAINERS},
    )
    learning_rate: float = opt(
        1e-4, help="Peak learning rate", min=0.0, max=1e3, when={"backend": TRAINERS}
    )
    weight_decay: float = opt(
        0.0, help="AdamW weight decay", min=0.0, max=1e3, when={"backend": TRAINERS}
    )
    warmup_steps: int = opt(
        0, help="Linear warm-up steps", min=0, max=INT32, when={"backend": TRAINERS}
    )
    lr_scheduler: str = opt(
        "cosine",
        help="Decay after warm-up",
        choices=("cosine", "linear", "constant"),
        when={"backend": TRAINERS},
    )
    max_grad_norm: float = opt(
        1.0, help="Gradient clipping norm; 0 disables", min=0.0, max=1e6, when={"backend": TRAINERS}
    )
    seed: int = opt(
        42,
        help="Seed for weights init, LoRA init and data order",
        min=0,
        max=SEED_MAX,
        when={"backend": TRAINERS},
    )
    save_steps: int = opt(
        0,
        help="Checkpoint every N steps; 0 = only at the end and on stop",
        min=0,
        max=INT32,
        when={"backend": TRAINERS},
        group="checkpoints",
    )
    save_total_limit: int = opt(
        0,
        help="Keep only the newest N checkpoints; 0 = keep all",
        min=0,
        max=INT32,
        when={"backend": TRAINERS},
        group="checkpoints",
    )
    eval_steps: int = opt(
        0, help="Eval loss every N steps; 0 = never", min=0, max=INT32, when={"backend": TRAINERS}
    )
    gradient_checkpointing: bool = opt(
        False, help="Recompute activations in backward to save memory", when={"backend": TRAINERS}
    )
    resume_from: str = opt(
        "",
        help='Checkpoint folder to resume from; "auto" = the newest in the output directory',
        when={"backend": TRAINERS},
        group="checkpoints",
    )
    early_stop_patience: int = opt(
        0,
        help="Stop (with a checkpoint) after this many evals in a row whose eval loss did "
        "not improve by train.early_stop_min_delta; 0 = never",
        min=0,
        max=INT32,
        when={"backend": ("builtin",)},
    )
    early_stop_min_delta: float = opt(
        0.0,
        help="How much lower an eval loss must be to count as an improvement",
        min=0.0,
        max=1e6,
        when={"backend": ("builtin",)},
    )
    compile: bool = opt(
        True,
        help="torch.compile the decoder layers (CUDA only; CPU runs "
        "stay eager; falls back to eager if compiling fails)",
        when={"backend": TRAINERS},
    )


@dataclass
class ParallelSpec:
    strategy: str = opt(
        "ddp",
        help="How ranks share the work",
        choices=("ddp", "fsdp2", "deepspeed", "megatron"),
        when={"backend": TRAINERS},
    )
    cpu_offload: bool = opt(
        False,
        help="FSDP2: keep parameters and optimizer on the CPU",
        when={"backend": TRAINERS, "parallel.strategy": ("fsdp2",)},
    )
    zero_stage: int = opt(
        2,
        help="DeepSpeed ZeRO stage",
        choices=(0, 1, 2, 3),
        when={"backend": ("swift",), "parallel.strategy": ("deepspeed",)},
    )
    zero_offload: str = opt(
        "none",
        help="DeepSpeed offload target",
        choices=("none", "optimizer", "all"),
        when={"backend": ("swift",), "parallel.strategy": ("deepspeed",)},
    )
    tp: int = opt(
        1,
        help="Megatron tensor-parallel size",
        min=1,
        max=1 << 16,
        when={"backend": ("swift",), "parallel.strategy": ("megatron",)},
    )
    pp: int = opt(
        1,
        help="Megatron pipeline-parallel size",
        min=1,
        max=1 << 16,
        when={"backend": ("swift",), "parallel.strategy": ("megatron",)},
    )
    cp: int = opt(
        1,
        help="Megatron context-parallel size",
        min=1,
        max=1 << 16,
        when={"backend": ("swift",), "parallel.strategy": ("megatron",)},
    )
    ep: int = opt(
        1,
        help="Megatron expert-parallel size",
        min=1,
        max=1 << 16,
        when={"backend": ("swift",), "parallel.strategy": ("megatron",)},
    )
    sequence_parallel: bool = opt(
        False,
        help="Megatron sequence parallel (needs tp > 1)",
        when={"backend": ("swift",), "parallel.strategy": ("megatron",)},
    )


@dataclass
class ClusterSpec:
    nnodes: int = opt(1, help="Number of nodes", min=1, max=1 << 16)
    nproc_per_node: int = opt(
        0,
        help="Processes per node; 0 = one per visible GPU, or cluster.cpu_procs without GPUs",
        min=0,
        max=1024,
    )
    cpu_procs: int = opt(
        2,
        help="Processes per node when no GPU is present",
        min=1,
        max=1024,
        when={"cluster.device": ("auto", "cpu")},
    )
    gpus: str = opt(
        "",
        help='CUDA_VISIBLE_DEVICES for the run, e.g. "0,1"; empty = all',
        when={"cluster.device": ("auto", "cuda")},
    )
    device: str = opt("auto", help="Where ranks compute", choices=("auto", "cuda", "cpu"))
    dist_backend: str = opt(
        "auto",
        help="torch.distributed backend; auto = nccl on GPUs, gloo on CPU",
        choices=("auto", "nccl", "gloo"),
    )
    master_addr: str = opt("127.0.0.1", help="Rendezvous host (node 0)")
    master_port: int = opt(
        0, help="Rendezvous port; 0 = pick a free one at launch", min=0, max=65535
    )
    node_rank: int = opt(
        0, help="This node's rank", min=0, max=(1 << 16) - 1, when={"cluster.nnodes": _multi_node}
    )
    node_silence_s: int = opt(
        20,
        help="Seconds without a word from a node over ssh, with no step advancing on this "
        "node either, before it counts as lost (a link-only outage, while the ranks still "
        "train, never ends the run)",
        min=1,
        max=INT32,
        when={"cluster.launcher": ("ssh",)},
    )
    join_timeout_s: int = opt(
        600,
        help="Seconds a node waits for its peers to join",
        min=1,
        max=INT32,
        when={"cluster.nnodes": _multi_node},
    )
    collective_timeout_s: int = opt(
        0,
        help="Seconds a collective waits for every rank "
        "before the run fails (NCCL watchdog; ms-swift "
        "--ddp_timeout); 0 = the default (torch: 10 min, "
        "ms-swift: 208 days)",
        min=0,
        max=INT32,
        when={"backend": TRAINERS},
    )
    # the node roster (tunedeck.core.nodes checks the per-node lists against nnodes)
    launcher: str = opt(
        "manual",
        help="How the other nodes start: manual = by hand (tunedeck "
        "starts this node only), ssh = over the system ssh from this node "
        "(node 0), slurm = one sbatch job",
        choices=("manual", "ssh", "slurm"),
        when={"cluster.nnodes": _multi_node},
    )
    hosts: list[str] = opt(
        help="SSH destination of each node, node 0 (this one) first: "
        "host, user@host or a name from ~/.ssh/config",
        factory=list,
        when={"cluster.launcher": ("ssh",)},
    )
    node_gpus: list[str] = opt(
        help="CUDA_VISIBLE_DEVICES of each node, one entry per node; "
        "empty = cluster.gpus on every node",
        factory=list,
        when={"cluster.nnodes": _multi_node},
    )
    interface: str = opt(
        "",
        help="Network interface the ranks talk over (GLOO_SOCKET_IFNAME, "
        "NCCL_SOCKET_IFNAME); empty = their own choice",
        when={"cluster.nnodes": _multi_node},
    )
    remote_home: list[str] = opt(
        help="TUNEDECK_HOME on the other nodes, one for all or one per "
        "node; empty = node 0's TUNEDECK_HOME path",
        factory=list,
        when={"cluster.launcher": ("ssh",)},
    )
    remote_python: list[str] = opt(
        help="Python with tunedeck installed on the other nodes, one "
        "for all or one per node; empty = this Python's path",
        factory=list,
        when={"cluster.launcher": ("ssh",)},
    )
    slurm_args: list[str] = opt(
        help="Extra sbatch options, e.g. --partition=gpu",
        factory=list,
        when={"cluster.launcher": ("slurm",)},
    )


@dataclass
class RunPolicy:
    max_restarts: int = opt(
        0, help="torchrun restarts of the worker group after a failure", min=0, max=10_000
    )
    stop_grace_s: float = opt(
        60.0, help="Seconds a graceful stop waits before SIGKILL", min=0.0, max=7 * DAY_S
    )
    output_dir: str = opt(
        "", help="Where checkpoints go; empty = <run dir>/output", group="checkpoints"
    )
    restart_pause_s: float = opt(
        5.0, help="Pause between a failure and the next attempt", min=0.0, max=DAY_S
    )
    telemetry_interval_s: float = opt(
        1.0, help="Seconds between telemetry samples", min=0.1, max=3600.0
    )
    queue: bool = opt(
        False,
        help="Wait in this home's GPU queue until the run's GPUs are free (`tunedeck launch "
        "--queue`), instead of starting at once",
    )
    priority: int = opt(
        0, help="Queue order: higher first, then the time queued", min=-1000, max=1000
    )
    gpu_count: int = opt(
        0,
        help="GPUs a queued run takes when cluster.gpus names none (the first free ones, "
        "recorded in state.json); 0 = all of them",
        min=0,
        max=1024,
    )
    dataloader_probe: bool = opt(
        True,
        help="Time DataLoader waits in ms-swift/HF/script ranks (a small probe injected at launch)",
        when={"backend": ("swift", "script")},
    )
    flight_recorder: bool = opt(
        True,
        help="PyTorch's Flight Recorder in every rank: collectives dumped on a timeout and on "
        "a stall, read to name the rank missing from a collective",
    )


TRACKERS = ("tensorboard", "wandb", "mlflow")


@dataclass
class TrackingSpec:
    # The agent mirrors every backend's metrics (what it ingests into run.db) into the
    # trackers users already read (core/trackers); a tracker the backend reports to by
    # itself (ms-swift's or an HF script's --report_to) is named in backend_reports and
    # left to it, so its charts are not doubled.
    tensorboard: bool = opt(
        True,
        help="TensorBoard event files in <run dir>/tracking/tensorboard (`tunedeck tb` serves them)",
    )
    wandb: str = opt(
        "off",
        help="W&B: offline writes <run dir>/tracking/wandb (`wandb sync` later); online logs in",
        choices=("off", "offline", "online"),
    )
    wandb_project: str = opt(
        "tunedeck",
        help="W&B project",
        when={"tracking.wandb": ("offline", "online")},
    )
    mlflow: bool = opt(False, help="MLflow: log the run's metrics")
    mlflow_uri: str = opt(
        "",
        help="MLflow tracking URI; empty = a file store in <run dir>/tracking/mlruns",
        when={"tracking.mlflow": (True,)},
    )
    backend_reports: list[str] = opt(
        help="Trackers the backend writes by itself (ms-swift's or an HF script's "
        "--report_to): " + ", ".join(TRACKERS) + "; the agent's mirror leaves them out",
        factory=list,
        when={"backend": ("swift", "script", "llamafactory")},
    )


# what [alerts] `on` may name: a run's end, every error finding, or one finding's category
ALERT_EVENTS = (
    "finished",
    "failed",
    "stopped",
    "errors",
    "stall",
    "loss_anomaly",
    "dataloader_starvation",
    "straggler",
    "idle_gpus",
    "eta_reached",
)


@dataclass
class AlertsSpec:
    on: list[str] = opt(
        help="Events that alert: " + ", ".join(ALERT_EVENTS) + "; empty = the user's "
        "alerts.toml, else finished, failed, stopped, errors, stall, loss_anomaly",
        factory=list,
    )
    urls: list[str] = opt(
        help="Notification URLs (apprise: json://, slack://, ntfy://, tgram://, mailto://...); "
        "secrets: shown as **** everywhere but the run's 0600 secrets.json",
        factory=list,
    )
    command: list[str] = opt(
        help="A command (argv list, no shell) run for each alert with it as JSON on stdin",
        factory=list,
    )
    idle_minutes: float = opt(
        10.0,
        help="idle_gpus: minutes every GPU of a running run stays under 5% utilisation "
        "before it alerts",
        min=0.05,
        max=10080.0,
    )
    eta_margin: float = opt(
        0.25,
        help="eta_reached: how far past the end its early pace promised a run may still be "
        "running before it alerts (0.25 = a quarter longer)",
        min=0.0,
        max=100.0,
    )


@dataclass
class SwiftSpec:
    command: str = opt(
        "sft",
        help="ms-swift entry point",
        choices=("sft", "pt", "rlhf", "megatron-sft", "megatron-pt", "megatron-rlhf"),
        when={"backend": ("swift",)},
    )
    rlhf_type: str = opt(
        "",
        help="rlhf: dpo, grpo, kto, orpo, simpo, cpo, ppo, gkd",
        when={"backend": ("swift",), "swift.command": ("rlhf", "megatron-rlhf")},
    )
    use_vllm: bool = opt(
        False,
        help="GRPO: generate with vLLM",
        when={"backend": ("swift",), "swift.command": ("rlhf",)},
        group="method",
    )
    vllm_mode: str = opt(
        "colocate",
        help="GRPO: vLLM beside training or a separate server",
        choices=("colocate", "server"),
        when={"backend": ("swift",), "swift.use_vllm": (True,)},
        group="method",
    )
    extra_args: list[str] = opt(
        help="Flags passed to ms-swift unchanged", factory=list, when={"backend": ("swift",)}
    )


@dataclass
class ScriptSpec:
    path: str = opt(
        "", help="Training script (.py) run by each rank", when={"backend": ("script",)}
    )
    module: str = opt("", help="Or a module run as python -m MODULE", when={"backend": ("script",)})
    args: list[str] = opt(
        help="Arguments after the script", factory=list, when={"backend": ("script",)}
    )


@dataclass
class LlamaFactorySpec:
    python: str = opt(
        "",
        help="Python with llamafactory installed (its own venv: it pins older transformers "
        "and peft); empty = this Python",
        when={"backend": ("llamafactory",)},
    )
    stage: str = opt(
        "sft",
        help="LLaMA-Factory stage",
        choices=("pt", "sft", "rm", "ppo", "dpo", "kto"),
        when={"backend": ("llamafactory",)},
    )
    template: str = opt(
        "", help="Chat template (qwen, llama3...)", when={"backend": ("llamafactory",)}
    )
    dataset: list[str] = opt(
        help="Dataset names from dataset_info.json in llamafactory.dataset_dir (after data.path)",
        factory=list,
        when={"backend": ("llamafactory",)},
    )
    dataset_dir: str = opt(
        "", help="Folder holding dataset_info.json", when={"backend": ("llamafactory",)}
    )
    settings: list[str] = opt(
        help="Other LLaMA-Factory keys as key=value (YAML scalars, JSON lists)",
        factory=list,
        when={"backend": ("llamafactory",)},
    )


@dataclass
class RunSpec:
    name: str = opt("run", help="A short name shown in the runs list")
    backend: str = opt("builtin", help="What torchrun runs", choices=BACKEND_NAMES)
    model: ModelSpec = opt(help="The model", factory=ModelSpec)
    data: DataSpec = opt(help="The dataset", factory=DataSpec)
    method: MethodSpec = opt(help="Fine-tuning method", factory=MethodSpec)
    train: TrainSpec = opt(help="Hyperparameters", factory=TrainSpec)
    parallel: ParallelSpec = opt(help="Parallelism", factory=ParallelSpec)
    cluster: ClusterSpec = opt(help="Nodes, processes and rendezvous", factory=ClusterSpec)
    run: RunPolicy = opt(help="Restarts, stopping and outputs", factory=RunPolicy)
    tracking: TrackingSpec = opt(
        help="Metrics mirrored to TensorBoard, W&B, MLflow", factory=TrackingSpec
    )
    swift: SwiftSpec = opt(help="ms-swift backend options", factory=SwiftSpec)
    script: ScriptSpec = opt(help="Custom script backend options", factory=ScriptSpec)
    llamafactory: LlamaFactorySpec = opt(
        help="LLaMA-Factory backend options", factory=LlamaFactorySpec
    )
    alerts: AlertsSpec = opt(help="Alerts on a run's end and findings", factory=AlertsSpec)
    env: dict[str, str] = opt(
        help="Extra environment for every rank (NCCL_*, CUDA_*, ...)",
        factory=dict,
        group="environment",
    )

    def __post_init__(self) -> None:
        # the dotted keys the user wrote (a file, --set, a form edit): for the ms-swift
        # backend a key not written is unset and ms-swift's own default applies (`is_set`)
        self.explicit: set[str] = set()

    # -- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The spec as TOML. An ms-swift spec leaves out the keys that are not set, so the
        file read back still means "ms-swift's default" for them."""
        import tomli_w

        d = self.to_dict()
        if traits_of(self.backend).sparse_toml:
            for key in OPTIONS:
                if not is_set(self, key):
                    sect, _, leaf = key.rpartition(".")
                    table = d.get(sect, {}) if sect else d
                    table.pop(leaf, None)
            d = {k: v for k, v in d.items() if v != {} or k == "env"}
        return tomli_w.dumps(d)


# -- option table ------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    key: str  # dotted, e.g. "train.learning_rate"
    type: Any
    default: Any
    help: str
    choices: tuple | None
    min: float | None
    when: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    group: str = ""  # the form section (GROUPS)
    max: float | None = None

    def applies(self, spec: "RunSpec") -> bool:
        """Whether this option matters for `spec` (its backend, strategy, method...)."""
        for key, allowed in (self.when or {}).items():
            value = get_value(spec, key)
            if not (allowed(value) if callable(allowed) else value in allowed):
                return False
        return True


# The form's sections, in order: (id, title). An option's section is its `group=` or its
# table's entry here.
GROUPS = (
    ("run", "run"),
    ("model", "model"),
    ("data", "data"),
    ("method", "method"),
    ("parallelism", "parallelism"),
    ("cluster", "cluster and GPUs"),
    ("training", "training"),
    ("checkpoints", "checkpoints"),
    ("environment", "environment"),
)
GROUP_OF_TABLE = {
    "": "run",
    "model": "model",
    "data": "data",
    "method": "method",
    "train": "training",
    "parallel": "parallelism",
    "cluster": "cluster",
    "run": "environment",
    "tracking": "environment",
    "swift": "run",
    "script": "run",
    "llamafactory": "run",
    "alerts": "environment",
}


def _sections(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def options(cls: type = RunSpec, prefix: str = "") -> list[Option]:
    """Every leaf option of the spec, in declaration order."""
    out: list[Option] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(typ):
            out.extend(options(typ, key + "."))
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        group = f.metadata.get("group") or GROUP_OF_TABLE[prefix.rstrip(".")]
        out.append(
            Option(
                key,
                typ,
                default,
                f.metadata.get("help", ""),
                f.metadata.get("choices"),
                f.metadata.get("min"),
                f.metadata.get("when"),
                group,
                f.metadata.get("max"),
            )
        )
    return out


OPTIONS = {o.key: o for o in options()}


def is_set(spec: RunSpec, key: str) -> bool:
    """Whether the user set `key`: written in the spec (file, --set, form) or holding a value
    other than its declared default (code that assigns it, a resume). For the ms-swift
    backend an unset key emits no flag: ms-swift's default for the installed version applies."""
    if key in getattr(spec, "explicit", ()):
        return True
    return get_value(spec, key) != OPTIONS[key].default


def _leaf_keys(raw: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in raw.items():
        key = prefix + str(k)
        if isinstance(v, dict) and key != "env":
            out |= _leaf_keys(v, key + ".")
        elif key in OPTIONS:
            out.add(key)
    return out


def get_value(spec: RunSpec, key: str) -> Any:
    """The value of a dotted key; `env.NAME` reads one variable (None when unset)."""
    if key.startswith("env."):
        return spec.env.get(key[4:])
    node: Any = spec
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_option(key: str, value: Any) -> tuple[Any, str | None]:
    """(the value as stored, the problem naming the key or None): the check every TOML value
    and `--set` goes through, for one value from anywhere else (a form field, a fix)."""
    if key.startswith("env."):
        if value is None:
            return None, _env_name_problem(key[4:])
        return _check_env_var(key[4:], value)
    opt_ = OPTIONS.get(key)
    if opt_ is None:
        near = [k for k in OPTIONS if k.split(".")[-1] == key.split(".")[-1]]
        return value, f"unknown key {key!r}" + (f" (did you mean {near[0]}?)" if near else "")
    return _check_value(key, opt_.type, value, opt_)


def parse_value(key: str, text: str) -> tuple[Any, str | None]:
    """A value typed as text (a form field) → (value, problem). Strings are taken as typed;
    numbers and booleans as TOML literals, like `--set`; lists as shell-style words
    (`q_proj "a b"`); the env table as NAME=VALUE words."""
    opt_ = OPTIONS.get(key)
    typ = opt_.type if opt_ else str
    if typ is str:
        return check_option(key, text)
    if typing.get_origin(typ) in (list, dict):
        import shlex

        try:
            words = shlex.split(text)
        except ValueError as e:
            return text, f"{key}: {e}"
        if typing.get_origin(typ) is list:
            return check_option(key, words)
        env: dict[str, str] = {}
        for w in words:
            name, eq, val = w.partition("=")
            if not eq:
                return text, f"{key}: {w!r} is not NAME=VALUE"
            env[name] = val
        return check_option(key, env)
    text = text.strip()
    if not text:
        return text, f"{key} must be {_type_name(typ)}, got nothing"
    _, value = parse_override(f"{key}={text}")
    return check_option(key, value)


def set_values(spec: RunSpec, values: dict[str, Any]) -> RunSpec:
    """A copy of `spec` with dotted keys set (a form edit, a preflight fix, the advisor's
    overrides), each checked like a TOML value; `env.NAME: None` removes a variable. Raises
    SpecError naming every bad key. Cross-key rules are `cross_checks`' job."""
    new = copy.deepcopy(spec)
    problems = []
    for key, value in values.items():
        value, err = check_option(key, value)
        if err:
            problems.append(err)
            continue
        if key.startswith("env."):
            if value is None:
                new.env.pop(key[4:], None)
            else:
                new.env[key[4:]] = value
            continue
        *parents, leaf = key.split(".")
        node: Any = new
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, value)
        new.explicit.add(key)
    if problems:
        raise SpecError(problems)
    return new


# -- loading -----------------------------------------------------------------------------


class _Locator:
    """Finds the line a dotted key was written on, for error messages (tomllib keeps none)."""

    _header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
    _assign = re.compile(
        r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_\-]+(?:\s*\.\s*[A-Za-z0-9_\-]+)*)"
        r"\s*="
    )

    def __init__(self, text: str, source: str):
        self.source = source
        self.lines: dict[str, int] = {}
        table = ""
        for no, line in enumerate(text.splitlines(), start=1):
            m = self._header.match(line)
            if m:
                table = ".".join(p.strip().strip("\"'") for p in m.group(1).split("."))
                self.lines.setdefault(table, no)
                continue
            m = self._assign.match(line)
            if m:
                key = ".".join(p.strip().strip("\"'") for p in m.group(1).split("."))
                self.lines.setdefault(f"{table}.{key}" if table else key, no)

    def where(self, key: str) -> str:
        parts = key.split(".")
        while parts:  # fall back to the enclosing table when the key itself is absent
            no = self.lines.get(".".join(parts))
            if no:
                return f"{self.source}:{no}: "
            parts.pop()
        return f"{self.source}: "


def _type_name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ).replace("typing.", "")


def _short(value: Any, limit: int = 60) -> str:
    """A value for a message: its repr, cut short (a 1 MB string stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"…({len(text):,} chars)"


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _text_problem(key: str, text: str, extra_bytes: int = 0) -> str | None:
    """Why `text` cannot be one argument or variable of a process, or None. `extra_bytes`: what
    the OS counts besides it (`NAME=` of a variable)."""
    if "\x00" in text:
        return f"{key}: a NUL character cannot be passed to a process"
    try:
        n = len(text.encode("utf-8")) + extra_bytes + 1
    except UnicodeEncodeError:
        return f"{key}: not valid Unicode text (a lone surrogate)"
    if n > ARG_MAX_BYTES:
        return (
            f"{key}: {n} bytes is over the OS limit of {ARG_MAX_BYTES} bytes for one "
            f"argument or environment variable (NAME=VALUE and its NUL)"
        )
    return None


def _env_name_problem(name: str) -> str | None:
    key = f"env.{name}"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return f"{key}: not a valid environment variable name"
    if name.startswith(RESERVED_ENV):
        return (
            f"{key}: {RESERVED_ENV}* variables are set by tunedeck itself (the run's id, "
            f"folder and attempt); use another name"
        )
    return None


def _check_env_var(name: str, value: Any) -> tuple[Any, str | None]:
    """One variable of the env table: (its value as stored, the problem or None)."""
    key = f"env.{name}"
    err = _env_name_problem(name)
    if err:
        return value, err
    if not isinstance(value, (str, int, float, bool)):
        return value, f"{key} must be a string, number or boolean"
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text, _text_problem(key, text, len(name.encode("utf-8", "replace")) + 1)


def _check_env(key: str, value: Any) -> tuple[Any, list[tuple[str, str]]]:
    """The env table: (the variables as stored, [(env.NAME, problem)])."""
    if not isinstance(value, dict):
        return value, [
            (
                key,
                f"{key} must be a table of NAME = value, got "
                f"{type(value).__name__} {_short(value)}",
            )
        ]
    out: dict[str, str] = {}
    problems = []
    for name, v in value.items():
        v, err = _check_env_var(str(name), v)
        if err:
            problems.append((f"env.{name}", err))
        else:
            out[str(name)] = v
    return out, problems


def _check_value(key: str, typ: Any, value: Any, opt_: Option | None) -> tuple[Any, str | None]:
    origin = typing.get_origin(typ)
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                value = float(value)
            except OverflowError:  # an int too large for a float
                value = math.inf if value > 0 else -math.inf
    elif typ is str:
        ok = isinstance(value, str)
    elif origin is list:
        (item,) = typing.get_args(typ)
        if isinstance(value, str):
            value = [value]
        ok = isinstance(value, list) and all(isinstance(v, item) for v in value)
    elif origin is dict:
        value, problems = _check_env(key, value)
        return value, (problems[0][1] if problems else None)
    else:  # pragma: no cover - every declared type is handled above
        ok = True
    if not ok:
        return value, (
            f"{key} must be {_type_name(typ)}, got {type(value).__name__} {_short(value)}"
        )
    if typ is float and not math.isfinite(value):
        return value, f"{key} must be a finite number, got {value!r}"
    if opt_ and opt_.choices and value not in opt_.choices:
        return value, (
            f"{key} must be one of {', '.join(map(str, opt_.choices))}, got {_short(value)}"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool) and opt_:
        if opt_.min is not None and value < opt_.min:
            return value, f"{key} must be >= {_bound(opt_.min)}, got {_short(value)}"
        if opt_.max is not None and value > opt_.max:
            return value, f"{key} must be <= {_bound(opt_.max)}, got {_short(value)}"
    for text in value if isinstance(value, list) else [value] if isinstance(value, str) else []:
        err = _text_problem(key, text)
        if err:
            return value, err
    return value, None


def _build(
    cls: type,
    raw: dict[str, Any],
    prefix: str,
    problems: list[str],
    where: typing.Callable[[str], str],
) -> Any:
    hints = typing.get_type_hints(cls)
    fields_ = _sections(cls)
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        key = prefix + name
        f = fields_.get(name)
        if f is None:
            near = [n for n in fields_ if n.startswith(name[:3])] if len(name) >= 3 else []
            hint = f" (did you mean {prefix + near[0]}?)" if near else ""
            known = ", ".join(fields_)
            problems.append(
                f"{where(key)}unknown key {key!r}{hint}; "
                f"{'[' + prefix.rstrip('.') + '] takes' if prefix else 'known keys:'} "
                f"{known}"
            )
            continue
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, dict):
                problems.append(f"{where(key)}{key} must be a table, got {type(value).__name__}")
                continue
            kwargs[name] = _build(typ, value, key + ".", problems, where)
            continue
        if typing.get_origin(typ) is dict:  # the env table: one line per variable
            value, errs = _check_env(key, value)
            problems.extend(where(k) + err for k, err in errs)
            if isinstance(value, dict):  # not a table: refused above, never used
                kwargs[name] = value
            continue
        value, err = _check_value(key, typ, value, OPTIONS.get(key))
        if err:
            problems.append(where(key) + err)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, Any]:
    """`train.learning_rate=3e-4` → ("train.learning_rate", 3e-4). Values are TOML literals;
    anything that is not one is taken as a plain string, so `model.path=/x/y` works."""
    if "=" not in text:
        raise SpecError([f"--set {text!r}: expected dotted.key=value"])
    key, _, value = text.partition("=")
    key = key.strip()
    try:
        doc = tomllib.loads(f"v = {value}")
        parsed = doc["v"] if list(doc) == ["v"] else value  # `1\nx = 2` is not one literal
    except (tomllib.TOMLDecodeError, RecursionError):
        parsed = value
    return key, parsed


def _apply_override(raw: dict[str, Any], key: str, value: Any) -> str | None:
    if key.startswith("env."):
        raw.setdefault("env", {})[key[4:]] = value
        return None
    if key not in OPTIONS:
        near = [k for k in OPTIONS if k.split(".")[-1] == key.split(".")[-1]]
        hint = f" (did you mean {near[0]}?)" if near else ""
        return f"--set {key}: unknown key{hint}"
    node = raw
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            return f"--set {key}: {p} is not a table"
    node[leaf] = value
    return None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> RunSpec:
    """Read and validate a spec file. Relative data/model paths resolve from its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError([f"{path}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise SpecError(
            [
                f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                f"{e.start}); save the spec as UTF-8"
            ]
        ) from None
    return loads_spec(text, source=str(path), base_dir=path.resolve().parent, overrides=overrides)


def loads_spec(
    text: str,
    source: str = "<spec>",
    base_dir: Path | None = None,
    overrides: list[str] | None = None,
) -> RunSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError([f"{source}: not valid TOML: {e}"]) from None
    except RecursionError:
        raise SpecError(
            [f"{source}: not valid TOML for a spec: arrays or tables nested too deep"]
        ) from None
    locator = _Locator(text, source)
    problems: list[str] = []
    override_keys: set[str] = set()
    for item in overrides or []:
        key, value = parse_override(item)
        err = _apply_override(raw, key, value)
        if err:
            problems.append(err)
        override_keys.add(key)

    def where(key: str) -> str:
        return f"--set {key}: " if key in override_keys else locator.where(key)

    spec = _build(RunSpec, raw, "", problems, where)
    spec.explicit = _leaf_keys(raw)
    problems.extend(_between_keys(spec))
    if problems:
        raise SpecError(problems, source)
    if base_dir is not None:
        resolve_paths(spec, base_dir)
    return spec


def cross_checks(spec: RunSpec) -> list[str]:
    """Everything loading a file checks, for a spec that no file went through (a form's, a
    run's): every value against its declaration, then the rules between keys. Every message
    starts with a key it names."""
    return value_problems(spec) + _between_keys(spec)


def value_problems(spec: RunSpec) -> list[str]:
    """Each value of `spec` against its option's declaration (type, choices, bounds, text)."""
    out = []
    for key, o in OPTIONS.items():
        if typing.get_origin(o.type) is dict:
            out.extend(err for _, err in _check_env(key, get_value(spec, key))[1])
            continue
        _, err = _check_value(key, o.type, get_value(spec, key), o)
        if err:
            out.append(err)
    return out


def _between_keys(spec: RunSpec) -> list[str]:
    """Rules between keys; every message starts with a key it names."""
    out = []
    traits = traits_of(spec.backend)
    if traits.needs_data and not spec.data.path:
        out.append(f"data.path is required for the {traits.name} trainer")
    if spec.cluster.node_rank >= spec.cluster.nnodes:
        out.append(
            f"cluster.node_rank {spec.cluster.node_rank} must be < cluster.nnodes "
            f"{spec.cluster.nnodes}"
        )
    if traits.strategies is not None and spec.parallel.strategy not in traits.strategies:
        can = [
            t.name
            for t in BACKEND_TRAITS.values()
            if not t.needs_script
            and (t.strategies is None or spec.parallel.strategy in t.strategies)
        ]
        out.append(
            f'parallel.strategy {spec.parallel.strategy} needs backend = "{" or ".join(can)}"; '
            f"the {traits.name} trainer runs {' or '.join(traits.strategies)}"
        )
    if traits.needs_script and not (spec.script.path or spec.script.module):
        out.append(f'script.path or script.module is required for backend = "{traits.name}"')
    if traits.fp8_base and spec.method.fp8_base:
        if spec.method.type != "lora":
            out.append(f"method.fp8_base applies to method.type lora, not {spec.method.type}")
        elif spec.parallel.strategy != "ddp":
            out.append(
                f"method.fp8_base needs parallel.strategy ddp (the fp8 copies are not "
                f"sharded); got {spec.parallel.strategy}"
            )
        elif spec.model.dtype in ("float16", "float32"):
            out.append(
                f"method.fp8_base computes in bf16 (its fp8 products return bf16); "
                f"model.dtype is {spec.model.dtype}: set it to bfloat16 or auto"
            )
        elif spec.method.lora_dropout > 0:
            out.append(
                f"method.fp8_base needs method.lora_dropout = 0 (the fp8 LoRA layer "
                f"has no dropout); got {spec.method.lora_dropout}"
            )
    unknown = [e for e in spec.alerts.on if e not in ALERT_EVENTS]
    if unknown:
        out.append(
            f"alerts.on: unknown event {', '.join(unknown)}; known: {', '.join(ALERT_EVENTS)}"
        )
    unknown = [t for t in spec.tracking.backend_reports if t not in TRACKERS]
    if unknown:
        out.append(
            f"tracking.backend_reports: unknown tracker {', '.join(unknown)}; "
            f"known: {', '.join(TRACKERS)}"
        )
    if spec.method.type == "qlora" and spec.cluster.device == "cpu":
        out.append("method.type qlora needs a GPU (bitsandbytes 4-bit); use lora on CPU")
    total = sum(len(f"{k}={v}".encode("utf-8", "replace")) + 1 for k, v in spec.env.items())
    if total > ENV_TOTAL_BYTES:
        out.append(
            f"env: its variables take {total} bytes in all; a process gets at most "
            f"{ENV_TOTAL_BYTES} of them from a spec (arguments and environment share "
            "the OS's ARG_MAX); pass large data in a file"
        )
    return out


def resolve_paths(spec: RunSpec, base: Path) -> None:
    """Relative data/script/model paths, taken from `base` (a spec file's folder), in place."""
    for section, key in ((spec.data, "path"), (spec.data, "val_path"), (spec.script, "path")):
        value = getattr(section, key)
        if value and not Path(value).expanduser().is_absolute():
            setattr(section, key, str((base / value).resolve()))
    for key in ("datasets", "val_datasets"):
        setattr(spec.data, key, [resolve_dataset(d, base) for d in getattr(spec.data, key)])
    mp = spec.model.path
    if (
        mp
        and not mp.startswith("builtin:")
        and (mp.startswith(".") or "/" in mp and (base / mp).exists())
    ):
        if not Path(mp).expanduser().is_absolute():
            spec.model.path = str((base / mp).resolve())


DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".txt", ".parquet", ".arrow", ".tsv")


def resolve_dataset(entry: str, base: Path) -> str:
    """One ms-swift dataset entry as the spec file's folder means it: a local file or folder
    (one that exists there, or one written as a path: ./x, ../x, ~/x, /x, a data file's
    suffix) becomes absolute; anything else is a hub id (`org/name#500`, `org/name:split`)
    and stays exactly as written."""
    if not entry or Path(entry).expanduser().is_absolute():
        return entry
    looks_local = entry.startswith(("./", "../", "~")) or entry.lower().endswith(DATA_SUFFIXES)
    if looks_local or (base / entry).exists():
        return str((base / Path(entry).expanduser()).resolve())
    return entry


# -- secrets -----------------------------------------------------------------------------
#
# The one set of masking rules: every file, preview, export, import header and log line that
# shows a command or an environment masks through these (`mask_env`, `mask_argv`, `mask_spec`).
#
# A name (a variable, a flag without its dashes, a hydra key) is a credential when one of its
# word parts is a credential word. Parts are split at anything but a letter (`_ - . 0-9`) and at
# a camelCase step, in UPPER, lower or Capitalised form. Strong words count as any part:
# SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL(S), CREDS, AUTHORIZATION, and the pairs
# API_KEY and PRIVATE_KEY (also APIKEY, api-key, apiKey) (AWS_SECRET_ACCESS_KEY, SECRET_KEY_BASE,
# DB_PASSWORD_FILE, OPENAI_API_KEY). Weak words, which also name training things (text tokens,
# forward passes), count only as the last part, digits after it allowed: TOKEN, PASS, AUTH
# (HF_TOKEN, GITHUB_TOKEN2, DB_PASS, --hub_token, hubToken, use_auth_token, NPM_AUTH), so
# ms-swift's --moe_token_dispatcher_type, IMAGE_MAX_TOKEN_NUM, --vllm_server_pass_dataset and
# SSH_AUTH_SOCK are not credentials. KEY alone is no credential word: ms-swift's
# --teacher_tag_key, --reft_layer_key and --vera_projection_prng_key (an int) are settings, and a
# masked one in an exported command changes the run or makes ms-swift refuse it. A credential
# word inside a longer word is not one: KEYBOARD, TOKENIZERS_PARALLELISM, --lazy_tokenize,
# --model_author, AUTHOR, BYPASS, --max_new_tokens and --new_special_tokens (TOKENS, a count, is
# no credential word), PGPASSWORD (one word: set it as PG_PASSWORD or mask it by hand).

STRONG_SECRET_WORDS = (
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTHORIZATION",
)
STRONG_SECRET_PAIRS = (("API", "KEY"), ("PRIVATE", "KEY"))
WEAK_SECRET_WORDS = ("TOKEN", "PASS", "AUTH")
MASK = "****"


def _word_forms(word: str, last: bool) -> list[str]:
    up, low, cap = word, word.lower(), word.capitalize()
    end = "(?=[^A-Za-z]*$)" if last else ""
    return [
        rf"(?<![A-Z]){up}(?![A-Za-z]){end}",  # HF_TOKEN, TOKEN2, myTOKEN
        rf"(?<![A-Za-z]){low}(?![a-z]){end}",  # hub_token, api-key
        rf"{cap}(?![a-z]){end}",
    ]  # hubToken, HFToken


def _pair_forms(a: str, b: str) -> list[str]:
    sep = r"[_\-.]?"
    return [
        rf"(?<![A-Z]){a}{sep}{b}(?![A-Za-z])",  # API_KEY, APIKEY
        rf"(?<![A-Za-z]){a.lower()}{sep}{b.lower()}(?![a-z])",  # api_key, api-key
        rf"(?<![A-Za-z]){a.lower()}{sep}{b.capitalize()}(?![a-z])",  # apiKey
        rf"{a.capitalize()}{sep}{b.capitalize()}(?![a-z])",
    ]  # myApiKey, ApiKey


SECRET_PATTERN = re.compile(
    "|".join(
        [f for w in STRONG_SECRET_WORDS for f in _word_forms(w, last=False)]
        + [f for a, b in STRONG_SECRET_PAIRS for f in _pair_forms(a, b)]
        + [f for w in WEAK_SECRET_WORDS for f in _word_forms(w, last=True)]
    )
)
_ASSIGN = re.compile(r"([+~]*[A-Za-z_][\w.\-]*)=(.*)", re.S)  # NAME=value, +a.b_key=value


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name (dashes allowed) names a credential (rules above)."""
    return bool(SECRET_PATTERN.search(name))


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Environment safe to show or save: the values of credential names become ****."""
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in env.items()}


def mask_argv(argv: list[str]) -> list[str]:
    """A command safe to show, save or log: the value of a credential flag or assignment
    becomes ****, as `--hub_token abc`, `--hub_token=abc`, `-password abc`, `HF_TOKEN=abc` or
    `+wandb.api_key=abc`. A credential flag followed by another flag has no value to hide."""
    shown: list[str] = []
    hide_next = False
    for w in argv:
        if hide_next:
            hide_next = False
            if w and not w.startswith("-"):
                shown.append(MASK)
                continue
        if w.startswith("-"):
            name, eq, value = w.partition("=")
            secret = is_secret_name(name.lstrip("-"))
            if secret and eq:
                shown.append(f"{name}={MASK}" if value else w)
                continue
            hide_next = secret
            shown.append(w)
            continue
        m = _ASSIGN.fullmatch(w)
        if m and m.group(2) and is_secret_name(m.group(1)):
            shown.append(f"{m.group(1)}={MASK}")
            continue
        shown.append(w)
    return shown


def mask_spec(spec: RunSpec) -> RunSpec:
    """A copy of `spec` safe to save (a run's spec.toml): credential env values and the values
    of credential flags in swift.extra_args / script.args become ****."""
    out = copy.deepcopy(spec)
    out.env = mask_env(out.env)
    for key, mask in MASKED_LISTS.items():
        section, _, name = key.partition(".")
        holder = getattr(out, section)
        setattr(holder, name, mask(getattr(holder, name)))
    return out


def _mask_all(words: list[str]) -> list[str]:
    # a notification URL carries its service's token in its path or user part: all of it
    return [MASK for _ in words]


# the spec's lists that may hold a secret, and how each is masked (secrets.json keeps them)
MASKED_LISTS = {
    "swift.extra_args": mask_argv,
    "script.args": mask_argv,
    "alerts.urls": _mask_all,
    "alerts.command": mask_argv,
}
