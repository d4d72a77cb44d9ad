"""loss_anomaly: NaN/inf loss, a loss that collapses to exactly zero, a frozen grad norm
(exactly zero: nothing trains).

`LossWatch` takes records as they come (`feed`) and keeps a few numbers, not the records,
so the agent can watch a week-long run at a cost per step that never grows; `loss_findings`
is the same watch fed a whole list at once (`tunedeck diagnose`).
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Iterable

from tunedeck.core.diagnose.finding import Finding

FROZEN_STEPS = 5  # identical grad norms in a row before we call them frozen
ZERO_STEPS = 3
BAD_GRAD_STEPS = 3  # nan/inf grad norms in a row before we call it divergence
DIVERGED_FIX = (
    "Lower the learning rate or add warmup, clip gradients (max_grad_norm 1.0), "
    "train in bf16 instead of fp16, and check the data around that step for "
    "empty, truncated or all-masked samples."
)
SHOWN = 4  # records quoted as evidence


class _Run:
    """The longest run of consecutive records with some property, and the current one."""

    __slots__ = ("cur_len", "cur_head", "best_len", "best_head")

    def __init__(self) -> None:
        self.cur_len, self.cur_head = 0, []
        self.best_len, self.best_head = 0, []

    def extend(self, r: dict[str, Any]) -> None:
        self.cur_len += 1
        if len(self.cur_head) < SHOWN:
            self.cur_head.append(r)
        if self.cur_len > self.best_len:
            self.best_len, self.best_head = self.cur_len, list(self.cur_head)

    def restart(self, r: dict[str, Any] | None = None) -> None:
        self.cur_len, self.cur_head = 0, []
        if r is not None:
            self.extend(r)


class LossWatch:
    def __init__(self, source: str = "") -> None:
        self.source = source
        self.n = 0
        self.prev: dict[str, Any] | None = None
        self.bad = 0
        self.before_bad: dict[str, Any] | None = None  # the record before the first bad one
        self.bad_head: list[dict[str, Any]] = []
        self.had_nonzero = False
        self.zero = _Run()
        self.frozen = _Run()
        self.bad_grad = _Run()  # consecutive steps whose grad norm is nan/inf

    def feed(self, recs: Iterable[dict[str, Any]]) -> "LossWatch":
        for r in recs:
            loss, g = r.get("loss"), r.get("grad_norm")
            if isinstance(loss, float) and not math.isfinite(loss):
                if not self.bad:
                    self.before_bad = self.prev
                self.bad += 1
                if len(self.bad_head) < SHOWN:
                    self.bad_head.append(r)
            if isinstance(loss, (int, float)) and loss not in (0, 0.0):
                self.had_nonzero = True
            if loss == 0.0:
                self.zero.extend(r)
            else:
                self.zero.restart()
            if isinstance(g, float) and not math.isfinite(g):
                self.bad_grad.extend(r)
            else:
                self.bad_grad.restart()
            if isinstance(g, (int, float)):
                # a run in progress always ends at the previous record
                if (
                    self.frozen.cur_len
                    and self.prev is not None
                    and self.prev.get("grad_norm") == g
                ):
                    self.frozen.extend(r)
                else:
                    self.frozen.restart(r)
            else:
                self.frozen.restart()
            self.prev = r
            self.n += 1
        return self

    def _anomaly(
        self,
        kind: str,
        severity: str,
        summary: str,
        cause: str,
        fix: str,
        shown: list[dict[str, Any]],
        first: dict[str, Any],
    ) -> Finding:
        # the summary's counts grow while the run goes on; the kind and its first step stay,
        # so the agent's run.db keeps one finding that it refines
        return Finding(
            category="loss_anomaly",
            severity=severity,
            summary=summary,
            cause=cause,
            fix=fix,
            evidence=[_fmt(r) for r in shown],
            source=self.source,
            t=first.get("t"),
            ident=f"{kind}@{first.get('step')}",
        )

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        if self.bad:
            first = self.bad_head[0]
            out.append(
                self._anomaly(
                    "loss_nonfinite",
                    "error",
                    f"loss is {first['loss']} from step {first['step']} "
                    f"({self.bad} of {self.n} steps)",
                    "The loss became NaN/inf: the learning rate is too high, fp16 overflowed, "
                    "or a batch has no target tokens (all labels masked) or bad values.",
                    DIVERGED_FIX,
                    ([self.before_bad] if self.before_bad else []) + self.bad_head,
                    first,
                )
            )
        g = self.bad_grad
        head = g.best_head if g.best_len >= BAD_GRAD_STEPS else g.cur_head
        # fp16's loss scaler skips a step now and then on an inf gradient: that is normal;
        # several in a row, or the log ending on them, is a run that has diverged
        if not self.bad and (g.best_len >= BAD_GRAD_STEPS or g.cur_len >= 2):
            first = head[0]
            out.append(
                self._anomaly(
                    "grad_nonfinite",
                    "error",
                    f"gradients are {first['grad_norm']} from step {first['step']} "
                    f"({max(g.best_len, g.cur_len)} steps in a row)",
                    "The gradient norm is NaN/inf step after step: the optimizer skips or "
                    "applies garbage updates, and a loss printed as 0.0 or a finite number "
                    "meanwhile hides it (the learning rate is too high, fp16 overflowed, or "
                    "a batch has no target tokens).",
                    DIVERGED_FIX,
                    head,
                    first,
                )
            )
        z = self.zero
        if z.best_len >= ZERO_STEPS and self.had_nonzero:
            first = z.best_head[0]
            out.append(
                self._anomaly(
                    "loss_zero",
                    "warning",
                    f"loss collapsed to exactly 0 at step {first['step']} ({z.best_len} steps)",
                    "A loss of exactly zero means nothing is being learned from: all labels "
                    "are masked (-100), the loss is computed on padding, or the model saw the "
                    "answers in its input.",
                    "Check the label masking / template (ms-swift: --loss_scale, the chat "
                    "template), and that max_length does not truncate every answer.",
                    z.best_head,
                    first,
                )
            )
        f = self.frozen
        if f.best_len >= FROZEN_STEPS:
            first = f.best_head[0]
            if first["grad_norm"] == 0:
                out.append(
                    self._anomaly(
                        "grad_zero",
                        "error",
                        f"gradients are exactly 0 from step {first['step']} "
                        f"({f.best_len} steps): nothing is training",
                        "No gradient reaches any trainable parameter, so every update is zero "
                        "and the loss can only wander: the adapters sit on modules the forward "
                        "does not use, a custom layer detaches its input or runs under no_grad, "
                        "or a compiled graph dropped the backward (then the steps also look "
                        "faster and use less memory than they should).",
                        "Run a few steps with compile off (built-in: train.compile = false; "
                        "ms-swift: no --torch_compile): if gradients appear, the compiled graph "
                        "is at fault. Check that method.target_modules names modules of this "
                        "model.",
                        f.best_head,
                        first,
                    )
                )
            else:
                out.append(
                    self._anomaly(
                        "grad_frozen",
                        "warning",
                        f"grad norm frozen at {first['grad_norm']} from step "
                        f"{first['step']} ({f.best_len} steps)",
                        "The gradient norm is identical step after step: no parameter is being "
                        "trained (all frozen, LoRA not attached, learning rate 0) or the loss "
                        "does not depend on the inputs.",
                        "Check trainable parameters (LoRA target modules exist in the model), "
                        "the learning-rate schedule, and that gradients flow (no .detach() / "
                        "no_grad).",
                        f.best_head,
                        first,
                    )
                )
        return out


def loss_record(e: dict[str, Any]) -> dict[str, Any] | None:
    """What the metrics parser makes of a step event, for the fields LossWatch reads (step,
    loss, learning_rate, grad_norm, t): a NaN loss written as null is NaN."""
    step = e.get("step")
    if not isinstance(step, int):
        return None
    rec: dict[str, Any] = {"step": step}
    for src, dst in (("loss", "loss"), ("lr", "learning_rate"), ("grad_norm", "grad_norm")):
        v = e.get(src)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            rec[dst] = v
    t = e.get("t")
    if t is not None:
        rec["t"] = t
    if "loss" not in rec and "loss" in e:
        rec["loss"] = math.nan
    return rec


def loss_findings(recs: list[dict[str, Any]], source: str = "") -> list[Finding]:
    return LossWatch(source).feed(recs).findings()


def _fmt(r: dict[str, Any]) -> str:
    keys = ("step", "loss", "grad_norm", "learning_rate")
    return " ".join(f"{k}={r[k]}" for k in keys if k in r)
