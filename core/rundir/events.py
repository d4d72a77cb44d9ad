"""The metrics event stream of a run: `RUN_DIR/events/rank<r>.jsonl`, and its one writer.

The built-in trainer writes it from every rank; for ms-swift and script runs the agent writes
rank 0's file from what the ranks print (one writer per file either way).
One JSON object per line, appended and flushed as it happens; every rank writes its own file.
A torchrun restart appends to the same file, starting with a new `start` event. Every event has
`t` (unix time, float seconds), `kind` and `rank`. Non-finite floats (a NaN loss) are written
as null so every line is valid JSON.

kind "start" — once per attempt, after the model is built:
    world_size      int     ranks in the job
    device          str     "cpu" or "cuda:<local rank>"
    model           str     spec model.path as given (e.g. "builtin:tiny-qwen2")
    method          str     "full" | "lora"
    dtype           str     compute dtype: "float32" | "bfloat16" | "float16"
    trainable_params int    parameters the optimizer updates
    total_params    int     all parameters of the (wrapped) model
    max_steps       int
    strategy        str     "ddp" | "fsdp2"
    restart         int     attempt number: max(TUNEDECK_ATTEMPT, TORCHELASTIC_RESTART_COUNT)
    start_step      int     steps already done (0, or the resumed checkpoint's step)
    resumed_from    str     checkpoint folder; only present when the run resumed

kind "step" — every optimizer step, every rank:
    step            int     1-based optimizer step just finished
    loss            float   token-weighted mean loss of this step over ALL ranks (all-reduced;
                            identical in every rank's file)
    lr              float   learning rate used for this step
    grad_norm       float   gradient norm before clipping (same on every rank)
    tokens          int     non-padding tokens this rank processed in the step (all micro-steps)
    label_tokens    int     of those, tokens that carry loss (built-in trainer)
    mem_reserved_gib float  GPU: torch.cuda.max_memory_reserved (built-in trainer)
    step_s          float   wall time of the step on this rank: from asking for its first batch
                            to the end of its all-reduce (includes data_wait_s; checkpoint
                            saves are not counted)
    data_wait_s     float   time this rank blocked in next(dataloader) during the step
    compute_s       float   forward-pass time of this rank in the step (a compute proxy: under
                            DDP the forward has no collective, so a slow rank shows here while
                            step_s is equalised by the all-reduce); used by straggler detection
    mem_gib         float   GPU: torch.cuda.max_memory_allocated; CPU: process RSS (GiB)
    tokens_per_s    float   tokens / step_s for this rank
    epoch           int     epoch the step's last batch came from (0-based)
    mfu             float   model FLOPs utilisation of this rank (see tunedeck.core.train.flops);
                            null on CPU or a GPU without a known peak

kind "eval" — every train.eval_steps steps when there is eval data, every rank:
    step            int     the optimizer step just finished
    eval_loss       float   token-weighted mean loss over the whole eval set, all ranks
    eval_tokens     int     label tokens it was computed on (all ranks)

kind "checkpoint" — rank 0 only, after a checkpoint folder is complete and visible:
    step            int
    path            str     absolute path of <output_dir>/checkpoint-<step>

kind "phase" — what a rank is doing between steps, when that takes long (built-in trainer;
    for ms-swift and scripts the agent writes "tokenizing" from their data-stage bars):
    phase           str     "compiling" (torch.compile of a new batch shape; est_s, shape)
                            | "training" (compiling done; compile_s, graphs)
                            | "eager_fallback" (compiling failed; error; training goes on eager)
                            | "tokenizing" (the data stage before step 1: done, total
                              samples, rate per s, eta_s; parsed ones add `stage`, the
                              bar's name, e.g. "Map (num_proc=4)", and once `warning` when
                              the stage would outlast the collective timeout)
    step            int     steps done when the phase began

kind "end" — once per attempt, every rank:
    step            int     last optimizer step finished (the same on every rank)
    reason          str     "completed" (reached max_steps) | "stopped" (SIGTERM/SIGINT) |
                            "early_stop" (train.early_stop_patience; `early_stop` says why)
                            | "failed" (exception; the process exits non-zero)
    loss            float   loss of the last step (null if no step ran)
    error           str     only with reason "failed": the exception, one line
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from tunedeck.core.rundir import RunDir

KINDS = ("start", "step", "eval", "checkpoint", "end", "phase")


def json_value(v: Any) -> Any:
    """NaN and inf as null: JSON has no literal for them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# The type of each field a reader relies on. An event line is data another process wrote (a
# user's script, a damaged disk): `clean_event` drops a field whose value is not of its type,
# so a reader sees it as missing instead of failing on it.
_INT_FIELDS = (
    "rank",
    "step",
    "tokens",
    "label_tokens",
    "epoch",
    "world_size",
    "max_steps",
    "restart",
    "start_step",
    "trainable_params",
    "total_params",
    "eval_tokens",
)
_NUM_FIELDS = (
    "loss",
    "lr",
    "grad_norm",
    "mem_reserved_gib",
    "step_s",
    "data_wait_s",
    "compute_s",
    "mem_gib",
    "tokens_per_s",
    "mfu",
    "eval_loss",
    "token_acc",
)
_STR_FIELDS = (
    "kind",
    "device",
    "model",
    "method",
    "dtype",
    "strategy",
    "resumed_from",
    "path",
    "phase",
    "reason",
    "error",
    "early_stop",
)
T_MAX = 1e11  # unix seconds past any real clock (year 5138): a time beyond is noise
_I64 = 1 << 63


def clean_event(e: dict[str, Any]) -> dict[str, Any]:
    """`e` (changed in place) without the fields whose values are not of the schema's type:
    ints (not bools) that fit 64 bits and are not negative, finite numbers, strings, and a
    `t` that is a plausible unix time."""
    for k in [k for k, v in e.items() if not _field_ok(k, v)]:
        del e[k]
    return e


def _field_ok(key: str, v: Any) -> bool:
    if v is None:
        return key != "kind"
    if key == "t":
        return type(v) in (int, float) and 0 <= v < T_MAX
    if key in _INT_FIELDS:
        return type(v) is int and 0 <= v < _I64
    if key in _NUM_FIELDS:  # an int past a float's range is no number a reader can use
        return (type(v) is float and math.isfinite(v)) or (type(v) is int and abs(v) < 1e308)
    if key in _STR_FIELDS:
        return type(v) is str
    return True


class EventWriter:
    """Appends events of one rank; each line is flushed and written with one write call.

    `dedupe_steps` drops a step or eval event whose step was written before (the agent reads
    metrics from logs that may repeat them: console dicts and logging.jsonl, a re-read).
    """

    def __init__(self, run_dir: str | Path, rank: int, dedupe_steps: bool = False):
        self.rank = rank
        self.path = RunDir(run_dir).event_file(rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self._seen: set[tuple[str, int]] | None = set() if dedupe_steps else None
        self.last_step = 0

    def emit(self, kind: str, **fields: Any) -> dict[str, Any] | None:
        """The event as written, or None when `dedupe_steps` dropped it."""
        assert kind in KINDS, kind
        if kind in ("step", "eval"):
            step = int(fields.get("step") or 0)
            if self._seen is not None:
                if (kind, step) in self._seen:
                    return None
                self._seen.add((kind, step))
            if kind == "step":
                self.last_step = max(self.last_step, step)
        event = {"t": time.time(), "kind": kind, "rank": self.rank}
        event.update({k: json_value(v) for k, v in fields.items()})
        event["rank"] = self.rank
        self._f.write(json.dumps(event) + "\n")
        self._f.flush()
        return event

    def sync(self) -> None:
        """fsync at milestones (checkpoint, end) so a host crash keeps them."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def restart_at(self, step: int) -> None:
        """A new attempt goes on after `step` (its checkpoint's, 0 from the start): the steps
        it repeats are its own, not repeats to drop."""
        if self._seen is not None:
            self._seen.clear()
        self.last_step = step

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def from_record(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A step (or eval) event for a metrics record normalised by tunedeck.core.ingest.metrics
    (what the agent writes for runs whose ranks print their metrics)."""
    if "loss" in rec:
        ev: dict[str, Any] = {"kind": "step", "step": rec["step"], "loss": rec["loss"]}
        for src, dst in (
            ("learning_rate", "lr"),
            ("grad_norm", "grad_norm"),
            ("mem_gib", "mem_gib"),
            ("token_acc", "token_acc"),
            ("epoch", "epoch"),
            ("step_s", "step_s"),
            ("tokens_per_s", "tokens_per_s"),
        ):
            if rec.get(src) is not None:
                ev[dst] = rec[src]
        return ev
    if "eval_loss" in rec:
        return {"kind": "eval", "step": rec["step"], "eval_loss": rec["eval_loss"]}
    return None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """All events of one rank file (tests and small tools; the ingester tails instead)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
