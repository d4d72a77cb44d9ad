"""RunSpec: everything that defines a training run, loaded from TOML and validated.

Each option is declared once, as a dataclass field with its help, choices and bounds in the
field metadata. The same declaration drives TOML loading, `--set` overrides, validation messages
and (later) form fields, so the three never drift apart.

Errors name the dotted key and, when it came from a file, the file and line.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A spec that cannot be used. `problems` holds one line per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid run spec:\n  " + "\n  ".join(problems))


def opt(default: Any = dataclasses.MISSING, *, help: str, choices: tuple | None = None,
        min: float | None = None, factory: Any = None) -> Any:
    meta = {"help": help, "choices": choices, "min": min}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelSpec:
    path: str = opt("builtin:tiny-qwen2", help="Model directory or hub id; builtin:tiny-qwen2 "
                    "builds a tiny random Qwen2 for demos and tests")
    dtype: str = opt("auto", help="Weights/compute dtype; auto = bf16 on GPUs that support it, "
                     "fp32 on CPU", choices=("auto", "float32", "bfloat16", "float16"))
    attn_impl: str = opt("sdpa", help="Attention kernel", choices=("sdpa", "eager",
                                                                   "flash_attention_2"))


@dataclass
class DataSpec:
    path: str = opt("", help="Training data (.jsonl or .json; see data.format); relative "
                    "paths are resolved from the spec file's folder")
    max_length: int = opt(128, help="Tokens per sample; longer samples are truncated", min=8)
    num_workers: int = opt(0, help="DataLoader worker processes per rank", min=0)
    format: str = opt("auto", help="Row format; auto detects it from the first row",
                      choices=("auto", "messages", "query_response", "alpaca", "self_cognition"))
    val_split: float = opt(0.0, help="Rows held out for eval: a fraction below 1, a row count "
                           "from 1 up (0 = none)", min=0.0)
    val_path: str = opt("", help="Separate eval file; overrides data.val_split")
    truncation: str = opt("right", help="What to do with samples over max_length",
                          choices=("right", "left", "drop"))
    skip_bad_rows: bool = opt(False, help="Skip malformed rows (with a warning) instead of "
                              "failing with file:line")
    packing: bool = opt(False, help="Pack samples into full-length rows (padding-free)")
    model_name: str = opt("", help="Self-cognition: the name the model should give itself")
    model_author: str = opt("", help="Self-cognition: the author the model should name")


@dataclass
class MethodSpec:
    type: str = opt("lora", help="Fine-tuning method", choices=("full", "lora", "qlora"))
    lora_rank: int = opt(8, help="LoRA rank r", min=1)
    lora_alpha: int = opt(16, help="LoRA alpha (scaling = alpha / r)", min=1)
    lora_dropout: float = opt(0.0, help="Dropout on the LoRA branch", min=0.0)
    target_modules: list[str] = opt(help="Modules LoRA adapts; [\"all-linear\"] for every linear "
                                    "layer but the output head", factory=lambda: ["all-linear"])
    quant_bits: int = opt(4, help="QLoRA: bits of the frozen base weights", choices=(4, 8))
    merge_lora: bool = opt(False, help="Also save the base model with the adapter merged in")


@dataclass
class TrainSpec:
    max_steps: int = opt(100, help="Optimizer steps to run", min=1)
    per_device_batch_size: int = opt(4, help="Samples per rank per micro-step", min=1)
    grad_accum: int = opt(1, help="Micro-steps accumulated per optimizer step", min=1)
    learning_rate: float = opt(1e-4, help="Peak learning rate", min=0.0)
    weight_decay: float = opt(0.0, help="AdamW weight decay", min=0.0)
    warmup_steps: int = opt(0, help="Linear warm-up steps", min=0)
    lr_scheduler: str = opt("cosine", help="Decay after warm-up",
                            choices=("cosine", "linear", "constant"))
    max_grad_norm: float = opt(1.0, help="Gradient clipping norm; 0 disables", min=0.0)
    seed: int = opt(42, help="Seed for weights init, LoRA init and data order")
    save_steps: int = opt(0, help="Checkpoint every N steps; 0 = only at the end and on stop",
                          min=0)
    save_total_limit: int = opt(0, help="Keep only the newest N checkpoints; 0 = keep all",
                                min=0)
    eval_steps: int = opt(0, help="Eval loss every N steps; 0 = never", min=0)
    gradient_checkpointing: bool = opt(False, help="Recompute activations in backward to "
                                       "save memory")
    resume_from: str = opt("", help="Checkpoint folder to resume from; \"auto\" = the newest "
                           "in the output directory")
    compile: bool = opt(False, help="torch.compile the model")


@dataclass
class ParallelSpec:
    strategy: str = opt("ddp", help="How ranks share the work",
                        choices=("ddp", "fsdp2", "deepspeed", "megatron"))
    cpu_offload: bool = opt(False, help="FSDP2: keep parameters and optimizer on the CPU")
    zero_stage: int = opt(2, help="DeepSpeed ZeRO stage", choices=(0, 1, 2, 3))
    zero_offload: str = opt("none", help="DeepSpeed offload target",
                            choices=("none", "optimizer", "all"))
    tp: int = opt(1, help="Megatron tensor-parallel size", min=1)
    pp: int = opt(1, help="Megatron pipeline-parallel size", min=1)
    cp: int = opt(1, help="Megatron context-parallel size", min=1)
    ep: int = opt(1, help="Megatron expert-parallel size", min=1)
    sequence_parallel: bool = opt(False, help="Megatron sequence parallel (needs tp > 1)")


@dataclass
class ClusterSpec:
    nnodes: int = opt(1, help="Number of nodes", min=1)
    nproc_per_node: int = opt(0, help="Processes per node; 0 = one per visible GPU, or "
                              "cluster.cpu_procs without GPUs", min=0)
    cpu_procs: int = opt(2, help="Processes per node when no GPU is present", min=1)
    gpus: str = opt("", help="CUDA_VISIBLE_DEVICES for the run, e.g. \"0,1\"; empty = all")
    device: str = opt("auto", help="Where ranks compute", choices=("auto", "cuda", "cpu"))
    dist_backend: str = opt("auto", help="torch.distributed backend; auto = nccl on GPUs, "
                            "gloo on CPU", choices=("auto", "nccl", "gloo"))
    master_addr: str = opt("127.0.0.1", help="Rendezvous host (node 0)")
    master_port: int = opt(0, help="Rendezvous port; 0 = pick a free one at launch", min=0)
    node_rank: int = opt(0, help="This node's rank", min=0)
    join_timeout_s: int = opt(600, help="Seconds a node waits for its peers to join", min=1)
    collective_timeout_s: int = opt(0, help="Seconds a collective waits for every rank "
                                    "before the run fails (NCCL watchdog; ms-swift "
                                    "--ddp_timeout); 0 = the default (torch: 10 min, "
                                    "ms-swift: 208 days)", min=0)


@dataclass
class RunPolicy:
    max_restarts: int = opt(0, help="torchrun restarts of the worker group after a failure",
                            min=0)
    stop_grace_s: float = opt(60.0, help="Seconds a graceful stop waits before SIGKILL",
                              min=0.0)
    output_dir: str = opt("", help="Where checkpoints go; empty = <run dir>/output")
    restart_pause_s: float = opt(5.0, help="Pause between a failure and the next attempt",
                                 min=0.0)
    telemetry_interval_s: float = opt(1.0, help="Seconds between telemetry samples", min=0.1)
    dataloader_probe: bool = opt(True, help="Time DataLoader waits in ms-swift/HF/script ranks "
                                 "(a small probe injected at launch)")


@dataclass
class SwiftSpec:
    command: str = opt("sft", help="ms-swift entry point",
                       choices=("sft", "pt", "rlhf", "megatron-sft", "megatron-pt"))
    rlhf_type: str = opt("", help="rlhf: dpo, grpo, kto, orpo, simpo, cpo, ppo, gkd")
    use_vllm: bool = opt(False, help="GRPO: generate with vLLM")
    vllm_mode: str = opt("colocate", help="GRPO: vLLM beside training or a separate server",
                         choices=("colocate", "server"))
    extra_args: list[str] = opt(help="Flags passed to ms-swift unchanged", factory=list)


@dataclass
class ScriptSpec:
    path: str = opt("", help="Training script (.py) run by each rank")
    module: str = opt("", help="Or a module run as python -m MODULE")
    args: list[str] = opt(help="Arguments after the script", factory=list)


@dataclass
class RunSpec:
    name: str = opt("run", help="A short name shown in the runs list")
    backend: str = opt("builtin", help="What torchrun runs",
                       choices=("builtin", "swift", "script"))
    model: ModelSpec = opt(help="The model", factory=ModelSpec)
    data: DataSpec = opt(help="The dataset", factory=DataSpec)
    method: MethodSpec = opt(help="Fine-tuning method", factory=MethodSpec)
    train: TrainSpec = opt(help="Hyperparameters", factory=TrainSpec)
    parallel: ParallelSpec = opt(help="Parallelism", factory=ParallelSpec)
    cluster: ClusterSpec = opt(help="Nodes, processes and rendezvous", factory=ClusterSpec)
    run: RunPolicy = opt(help="Restarts, stopping and outputs", factory=RunPolicy)
    swift: SwiftSpec = opt(help="ms-swift backend options", factory=SwiftSpec)
    script: ScriptSpec = opt(help="Custom script backend options", factory=ScriptSpec)
    env: dict[str, str] = opt(help="Extra environment for every rank (NCCL_*, CUDA_*, ...)",
                              factory=dict)

    # -- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


# -- option table ------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    key: str          # dotted, e.g. "train.learning_rate"
    type: Any
    default: Any
    help: str
    choices: tuple | None
    min: float | None


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
        out.append(Option(key, typ, default, f.metadata.get("help", ""),
                          f.metadata.get("choices"), f.metadata.get("min")))
    return out


OPTIONS = {o.key: o for o in options()}


# -- loading -----------------------------------------------------------------------------

class _Locator:
    """Finds the line a dotted key was written on, for error messages (tomllib keeps none)."""

    _header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
    _assign = re.compile(r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_\-]+(?:\s*\.\s*[A-Za-z0-9_\-]+)*)"
                         r"\s*=")

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


def _check_value(key: str, typ: Any, value: Any, opt_: Option | None) -> tuple[Any, str | None]:
    origin = typing.get_origin(typ)
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
    elif typ is str:
        ok = isinstance(value, str)
    elif origin is list:
        (item,) = typing.get_args(typ)
        if isinstance(value, str):
            value = [value]
        ok = isinstance(value, list) and all(isinstance(v, item) for v in value)
    elif origin is dict:
        ok = isinstance(value, dict)
        if ok:
            bad = [k for k, v in value.items() if not isinstance(v, (str, int, float, bool))]
            if bad:
                return value, f"{key}.{bad[0]} must be a string, number or boolean"
            value = {str(k): (str(v).lower() if isinstance(v, bool) else str(v))
                     for k, v in value.items()}
    else:  # pragma: no cover - every declared type is handled above
        ok = True
    if not ok:
        return value, (f"{key} must be {_type_name(typ)}, got {type(value).__name__} "
                       f"{value!r}")
    if opt_ and opt_.choices and value not in opt_.choices:
        return value, f"{key} must be one of {', '.join(map(str, opt_.choices))}, got {value!r}"
    if opt_ and opt_.min is not None and isinstance(value, (int, float)) and value < opt_.min:
        return value, f"{key} must be >= {opt_.min:g}, got {value!r}"
    return value, None


def _build(cls: type, raw: dict[str, Any], prefix: str, problems: list[str],
           where: typing.Callable[[str], str]) -> Any:
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
            problems.append(f"{where(key)}unknown key {key!r}{hint}; "
                            f"{'[' + prefix.rstrip('.') + '] takes' if prefix else 'known keys:'} "
                            f"{known}")
            continue
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, dict):
                problems.append(f"{where(key)}{key} must be a table, got {type(value).__name__}")
                continue
            kwargs[name] = _build(typ, value, key + ".", problems, where)
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
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
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
    return loads_spec(text, source=str(path), base_dir=path.resolve().parent,
                      overrides=overrides)


def loads_spec(text: str, source: str = "<spec>", base_dir: Path | None = None,
               overrides: list[str] | None = None) -> RunSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError([f"{source}: not valid TOML: {e}"]) from None
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
    problems.extend(_cross_checks(spec))
    if problems:
        raise SpecError(problems)
    if base_dir is not None:
        _resolve_paths(spec, base_dir)
    return spec


def _cross_checks(spec: RunSpec) -> list[str]:
    out = []
    if spec.backend == "builtin" and not spec.data.path:
        out.append("data.path is required for the builtin trainer")
    if spec.cluster.node_rank >= spec.cluster.nnodes:
        out.append(f"cluster.node_rank {spec.cluster.node_rank} must be < cluster.nnodes "
                   f"{spec.cluster.nnodes}")
    if spec.backend == "builtin" and spec.parallel.strategy not in ("ddp", "fsdp2"):
        out.append(f"parallel.strategy {spec.parallel.strategy} needs backend = \"swift\"; "
                   f"the builtin trainer runs ddp or fsdp2")
    if spec.backend == "script" and not (spec.script.path or spec.script.module):
        out.append("script.path or script.module is required for backend = \"script\"")
    if spec.parallel.sequence_parallel and spec.parallel.tp < 2:
        out.append("parallel.sequence_parallel needs parallel.tp > 1")
    if spec.method.type == "qlora" and spec.cluster.device == "cpu":
        out.append("method.type qlora needs a GPU (bitsandbytes 4-bit); use lora on CPU")
    for k in spec.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            out.append(f"env.{k}: not a valid environment variable name")
    return out


def _resolve_paths(spec: RunSpec, base: Path) -> None:
    for section, key in ((spec.data, "path"), (spec.data, "val_path"), (spec.script, "path")):
        value = getattr(section, key)
        if value and not Path(value).expanduser().is_absolute():
            setattr(section, key, str((base / value).resolve()))
    mp = spec.model.path
    if mp and not mp.startswith("builtin:") and (mp.startswith(".") or "/" in mp
                                                 and (base / mp).exists()):
        if not Path(mp).expanduser().is_absolute():
            spec.model.path = str((base / mp).resolve())


# AUTH but not AUTHOR (ms-swift's --model_author is a name, not a secret)
SECRET_PATTERN = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL"
                            r"|AUTH(?!OR))", re.I)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Environment safe to show or save: secret-looking values become ****."""
    return {k: ("****" if SECRET_PATTERN.search(k) and v else v) for k, v in env.items()}


def mask_argv(argv: list[str]) -> list[str]:
    """A command safe to show or save: the value of a secret-looking flag or variable becomes
    ****, as `--hub_token abc`, `--hub_token=abc` or `HF_TOKEN=abc`."""
    shown, hide = [], False
    for w in argv:
        k, eq, _ = w.partition("=")
        if hide:
            shown.append("****")
            hide = False
        elif eq and SECRET_PATTERN.search(k):
            shown.append(f"{k}=****")
        else:
            shown.append(w)
            hide = w.startswith("--") and bool(SECRET_PATTERN.search(w))
    return shown
