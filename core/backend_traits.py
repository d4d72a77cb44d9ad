"""What the layers below the backends need to know about each backend, as data.

The spec (its `backend` key's choices and the rules between keys), the estimator (whose
memory model and measured speed a run gets) and the advisor sit below `core/backends` and
may not import it, so the facts they branch on are kept here, one `Traits` per backend, and
nowhere else. The backends' registry (`core/backends/__init__.py` `BACKENDS`) refuses to load
when its names and these disagree, and each `Backend.traits` is the entry here
(tests/test_backend_names.py checks both). Callers above the backends ask
`backend_of(spec).traits`; callers below ask `traits_of(spec.backend)`. Nothing outside
`core/backends/<name>/` and this file compares a backend's name with a literal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    name: str
    # torchrun runs tunedeck's own trainer (tunedeck.core.train): FSDP2 is torch's own
    # (no accelerate), it writes the event stream itself
    own_trainer: bool = False
    # the estimate uses the built-in trainer's memory model: fp32 master weights for a full
    # fine-tune, fused AdamW, chunked cross-entropy, compiled layers, fused LoRA linears and
    # expandable segments on CUDA
    trainer_memory: bool = False
    # the utilisation and speed switches measured for this trainer (core/estimate/speed.py);
    # off: the generic figure and no switches
    measured_speed: bool = False
    # the strategy the advisor names for a sharded run
    sharded: str = "deepspeed"
    # parallel.strategy values it runs (None: every one the spec allows)
    strategies: tuple[str, ...] | None = None
    # the spec must name data.path (the trainer reads it)
    needs_data: bool = False
    # the spec must name script.path or script.module
    needs_script: bool = False
    # method.fp8_base applies (the trainer's fp8 frozen products)
    fp8_base: bool = False
    # the trainer drops bad data rows when data.skip_bad_rows is set (preflight offers it)
    skips_bad_rows: bool = False
    # data.path may name a hub dataset id ("org/name") rather than a local file
    hub_datasets: bool = False
    # `builtin:` model paths are the demo model, built by the agent before torchrun starts
    builds_demo_model: bool = False
    # a spec file keeps only the keys set (an unset key means the backend's own default), so
    # it may end without an [env] table
    sparse_toml: bool = False
    # the ranks install a SIGTERM handler (a graceful stop waits until they have) and a
    # a faulthandler dump on request (stacks without py-spy)
    rank_handlers: bool = False


BUILTIN = Traits(
    "builtin",
    own_trainer=True,
    trainer_memory=True,
    measured_speed=True,
    sharded="fsdp2",
    strategies=("ddp", "fsdp2"),
    needs_data=True,
    fp8_base=True,
    skips_bad_rows=True,
    builds_demo_model=True,
    rank_handlers=True,
)
SWIFT = Traits("swift", hub_datasets=True, builds_demo_model=True, sparse_toml=True)
SCRIPT = Traits("script", needs_script=True)
# LLaMA-Factory's trainer in its own Python; `builtin:` models are built here by the agent
LLAMAFACTORY = Traits("llamafactory", builds_demo_model=True, sparse_toml=True)

TRAITS: dict[str, Traits] = {t.name: t for t in (BUILTIN, SWIFT, SCRIPT, LLAMAFACTORY)}
NAMES: tuple[str, ...] = tuple(TRAITS)
# what a name that is no backend (a damaged or future spec) is read as
UNKNOWN = Traits("")


def traits_of(name: str | None) -> Traits:
    return TRAITS.get(name or "", UNKNOWN)
