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
        min: float | None = None, factory: Any = None, when: dict[str, Any] | None = None,
        group: str | None = None) -> Any:
    """`when`: {dotted key: allowed values (a tuple) or a predicate}; the option matters only
    when every listed key agrees (the form hides it otherwise; loading ignores it).
    `group`: the form section, when not the one of its table (GROUP_OF_TABLE)."""
    meta = {"help": help, "choices": choices, "min": min, "when": when, "group": group}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# -- applicability (`when=`) -----------------------------------------------------------------

TRAINERS = ("builtin", "swift")        # backends that read the model/data/method/train tables
LORA = ("lora", "qlora")


def _multi_node(n: int) -> bool:
    return n > 1


@dataclass
class ModelSpec:
    path: str = opt("builtin:tiny-qwen2", help="Model directory or hub id; builtin:tiny-qwen2 "
                    "builds a tiny random Qwen2 for demos and tests")
    dtype: str = opt("auto", help="Weights/compute dtype; auto = bf16 on GPUs that support it, "
                     "fp32 on CPU", choices=("auto", "float32", "bfloat16", "float16"),
                     when={"backend": TRAINERS})
    attn_impl: str = opt("sdpa", help="Attention kernel", choices=("sdpa", "eager",
                                                                   "flash_attention_2"),
                         when={"backend": TRAINERS})


@dataclass
class DataSpec:
    path: str = opt("", help="Training data (.jsonl or .json; see data.format); relative "
                    "paths are resolved from the spec file's folder")
    max_length: int = opt(128, help="Tokens per sample; longer samples are truncated", min=8,
                          when={"backend": TRAINERS})
    num_workers: int = opt(0, help="DataLoader worker processes per rank", min=0,
                           when={"backend": TRAINERS})
    format: str = opt("auto", help="Row format; auto detects it from the first row",
                      choices=("auto", "messages", "query_response", "alpaca", "self_cognition"),
                      when={"backend": TRAINERS})
    val_split: float = opt(0.0, help="Rows held out for eval: a fraction below 1, a row count "
                           "from 1 up (0 = none)", min=0.0, when={"backend": TRAINERS})
    val_path: str = opt("", help="Separate eval file; overrides data.val_split",
                        when={"backend": TRAINERS})
    truncation: str = opt("right", help="What to do with samples over max_length",
                          choices=("right", "left", "drop"), when={"backend": TRAINERS})
    skip_bad_rows: bool = opt(False, help="Skip malformed rows (with a warning) instead of "
                              "failing with file:line", when={"backend": ("builtin",)})
    packing: bool = opt(False, help="Pack samples into full-length rows (padding-free)",
                        when={"backend": TRAINERS})
    model_name: str = opt("", help="Self-cognition: the name the model should give itself",
                          when={"backend": TRAINERS, "data.format": ("self_cognition",)})
    model_author: str = opt("", help="Self-cognition: the author the model should name",
                            when={"backend": TRAINERS, "data.format": ("self_cognition",)})


@dataclass
class MethodSpec:
    type: str = opt("lora", help="Fine-tuning method", choices=("full", "lora", "qlora"),
                    when={"backend": TRAINERS})
    lora_rank: int = opt(8, help="LoRA rank r", min=1,
                         when={"backend": TRAINERS, "method.type": LORA})
    lora_alpha: int = opt(16, help="LoRA alpha (scaling = alpha / r)", min=1,
                          when={"backend": TRAINERS, "method.type": LORA})
    lora_dropout: float = opt(0.0, help="Dropout on the LoRA branch", min=0.0,
                              when={"backend": TRAINERS, "method.type": LORA})
    target_modules: list[str] = opt(help="Modules LoRA adapts; [\"all-linear\"] for every linear "
                                    "layer but the output head", factory=lambda: ["all-linear"],
                                    when={"backend": TRAINERS, "method.type": LORA})
    quant_bits: int = opt(4, help="QLoRA: bits of the frozen base weights", choices=(4, 8),
                          when={"backend": TRAINERS, "method.type": ("qlora",)})
    merge_lora: bool = opt(False, help="Also save the base model with the adapter merged in",
                           when={"backend": ("builtin",), "method.type": LORA},
                           group="checkpoints")


@dataclass
class TrainSpec:
    max_steps: int = opt(100, help="Optimizer steps to run", min=1, when={"backend": TRAINERS})
    per_device_batch_size: int = opt(4, help="Samples per rank per micro-step", min=1,
                                     when={"backend": TRAINERS})
    grad_accum: int = opt(1, help="Micro-steps accumulated per optimizer step", min=1,
                          when={"backend": TRAINERS})
    learning_rate: float = opt(1e-4, help="Peak learning rate", min=0.0,
                               when={"backend": TRAINERS})
    weight_decay: float = opt(0.0, help="AdamW weight decay", min=0.0,
                              when={"backend": TRAINERS})
    warmup_steps: int = opt(0, help="Linear warm-up steps", min=0, when={"backend": TRAINERS})
    lr_scheduler: str = opt("cosine", help="Decay after warm-up",
                            choices=("cosine", "linear", "constant"), when={"backend": TRAINERS})
    max_grad_norm: float = opt(1.0, help="Gradient clipping norm; 0 disables", min=0.0,
                               when={"backend": TRAINERS})
    seed: int = opt(42, help="Seed for weights init, LoRA init and data order",
                    when={"backend": TRAINERS})
    save_steps: int = opt(0, help="Checkpoint every N steps; 0 = only at the end and on stop",
                          min=0, when={"backend": TRAINERS}, group="checkpoints")
    save_total_limit: int = opt(0, help="Keep only the newest N checkpoints; 0 = keep all",
                                min=0, when={"backend": TRAINERS}, group="checkpoints")
    eval_steps: int = opt(0, help="Eval loss every N steps; 0 = never", min=0,
                          when={"backend": TRAINERS})
    gradient_checkpointing: bool = opt(False, help="Recompute activations in backward to "
                                       "save memory", when={"backend": TRAINERS})
    resume_from: str = opt("", help="Checkpoint folder to resume from; \"auto\" = the newest "
                           "in the output directory", when={"backend": TRAINERS},
                           group="checkpoints")
    compile: bool = opt(False, help="torch.compile the model", when={"backend": TRAINERS})


@dataclass
class ParallelSpec:
    strategy: str = opt("ddp", help="How ranks share the work",
                        choices=("ddp", "fsdp2", "deepspeed", "megatron"),
                        when={"backend": TRAINERS})
    cpu_offload: bool = opt(False, help="FSDP2: keep parameters and optimizer on the CPU",
                            when={"backend": TRAINERS, "parallel.strategy": ("fsdp2",)})
    zero_stage: int = opt(2, help="DeepSpeed ZeRO stage", choices=(0, 1, 2, 3),
                          when={"backend": ("swift",), "parallel.strategy": ("deepspeed",)})
    zero_offload: str = opt("none", help="DeepSpeed offload target",
                            choices=("none", "optimizer", "all"),
                            when={"backend": ("swift",), "parallel.strategy": ("deepspeed",)})
    tp: int = opt(1, help="Megatron tensor-parallel size", min=1,
                  when={"backend": ("swift",), "parallel.strategy": ("megatron",)})
    pp: int = opt(1, help="Megatron pipeline-parallel size", min=1,
                  when={"backend": ("swift",), "parallel.strategy": ("megatron",)})
    cp: int = opt(1, help="Megatron context-parallel size", min=1,
                  when={"backend": ("swift",), "parallel.strategy": ("megatron",)})
    ep: int = opt(1, help="Megatron expert-parallel size", min=1,
                  when={"backend": ("swift",), "parallel.strategy": ("megatron",)})
    sequence_parallel: bool = opt(False, help="Megatron sequence parallel (needs tp > 1)",
                                  when={"backend": ("swift",),
                                        "parallel.strategy": ("megatron",)})


@dataclass
class ClusterSpec:
    nnodes: int = opt(1, help="Number of nodes", min=1)
    nproc_per_node: int = opt(0, help="Processes per node; 0 = one per visible GPU, or "
                              "cluster.cpu_procs without GPUs", min=0)
    cpu_procs: int = opt(2, help="Processes per node when no GPU is present", min=1,
                         when={"cluster.device": ("auto", "cpu")})
    gpus: str = opt("", help="CUDA_VISIBLE_DEVICES for the run, e.g. \"0,1\"; empty = all",
                    when={"cluster.device": ("auto", "cuda")})
    device: str = opt("auto", help="Where ranks compute", choices=("auto", "cuda", "cpu"))
    dist_backend: str = opt("auto", help="torch.distributed backend; auto = nccl on GPUs, "
                            "gloo on CPU", choices=("auto", "nccl", "gloo"))
    master_addr: str = opt("127.0.0.1", help="Rendezvous host (node 0)")
    master_port: int = opt(0, help="Rendezvous port; 0 = pick a free one at launch", min=0)
    node_rank: int = opt(0, help="This node's rank", min=0,
                         when={"cluster.nnodes": _multi_node})
    join_timeout_s: int = opt(600, help="Seconds a node waits for its peers to join", min=1,
                              when={"cluster.nnodes": _multi_node})
    collective_timeout_s: int = opt(0, help="Seconds a collective waits for every rank "
                                    "before the run fails (NCCL watchdog; ms-swift "
                                    "--ddp_timeout); 0 = the default (torch: 10 min, "
                                    "ms-swift: 208 days)", min=0, when={"backend": TRAINERS})


@dataclass
class RunPolicy:
    max_restarts: int = opt(0, help="torchrun restarts of the worker group after a failure",
                            min=0)
    stop_grace_s: float = opt(60.0, help="Seconds a graceful stop waits before SIGKILL",
                              min=0.0)
    output_dir: str = opt("", help="Where checkpoints go; empty = <run dir>/output",
                          group="checkpoints")
    restart_pause_s: float = opt(5.0, help="Pause between a failure and the next attempt",
                                 min=0.0)
    telemetry_interval_s: float = opt(1.0, help="Seconds between telemetry samples", min=0.1)
    dataloader_probe: bool = opt(True, help="Time DataLoader waits in ms-swift/HF/script ranks "
                                 "(a small probe injected at launch)",
                                 when={"backend": ("swift", "script")})


@dataclass
class SwiftSpec:
    command: str = opt("sft", help="ms-swift entry point",
                       choices=("sft", "pt", "rlhf", "megatron-sft", "megatron-pt"),
                       when={"backend": ("swift",)})
    rlhf_type: str = opt("", help="rlhf: dpo, grpo, kto, orpo, simpo, cpo, ppo, gkd",
                         when={"backend": ("swift",), "swift.command": ("rlhf",)})
    use_vllm: bool = opt(False, help="GRPO: generate with vLLM",
                         when={"backend": ("swift",), "swift.command": ("rlhf",)},
                         group="method")
    vllm_mode: str = opt("colocate", help="GRPO: vLLM beside training or a separate server",
                         choices=("colocate", "server"),
                         when={"backend": ("swift",), "swift.use_vllm": (True,)},
                         group="method")
    extra_args: list[str] = opt(help="Flags passed to ms-swift unchanged", factory=list,
                                when={"backend": ("swift",)})


@dataclass
class ScriptSpec:
    path: str = opt("", help="Training script (.py) run by each rank",
                    when={"backend": ("script",)})
    module: str = opt("", help="Or a module run as python -m MODULE",
                      when={"backend": ("script",)})
    args: list[str] = opt(help="Arguments after the script", factory=list,
                          when={"backend": ("script",)})


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
                              factory=dict, group="environment")

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
    when: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    group: str = ""   # the form section (GROUPS)

    def applies(self, spec: "RunSpec") -> bool:
        """Whether this option matters for `spec` (its backend, strategy, method...)."""
        for key, allowed in (self.when or {}).items():
            value = get_value(spec, key)
            if not (allowed(value) if callable(allowed) else value in allowed):
                return False
        return True


# The form's sections, in order: (id, title). An option's section is its `group=` or its
# table's entry here.
GROUPS = (("run", "run"), ("model", "model"), ("data", "data"), ("method", "method"),
          ("parallelism", "parallelism"), ("cluster", "cluster and GPUs"),
          ("training", "training"), ("checkpoints", "checkpoints"),
          ("environment", "environment"))
GROUP_OF_TABLE = {"": "run", "model": "model", "data": "data", "method": "method",
                  "train": "training", "parallel": "parallelism", "cluster": "cluster",
                  "run": "environment", "swift": "run", "script": "run"}


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
        out.append(Option(key, typ, default, f.metadata.get("help", ""),
                          f.metadata.get("choices"), f.metadata.get("min"),
                          f.metadata.get("when"), group))
    return out


OPTIONS = {o.key: o for o in options()}


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
        name = key[4:]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            return value, f"{key}: not a valid environment variable name"
        if value is None:
            return None, None
        if not isinstance(value, (str, int, float, bool)):
            return value, f"{key} must be a string, number or boolean"
        return (str(value).lower() if isinstance(value, bool) else str(value)), None
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
        value, err = check_option(key, env)
        bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        return value, err or (f"env.{bad[0]}: not a valid environment variable name"
                              if bad else None)
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
    if problems:
        raise SpecError(problems)
    return new


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
    problems.extend(cross_checks(spec))
    if problems:
        raise SpecError(problems)
    if base_dir is not None:
        resolve_paths(spec, base_dir)
    return spec


def cross_checks(spec: RunSpec) -> list[str]:
    """Rules between keys; every message starts with a key it names."""
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


def resolve_paths(spec: RunSpec, base: Path) -> None:
    """Relative data/script/model paths, taken from `base` (a spec file's folder), in place."""
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
