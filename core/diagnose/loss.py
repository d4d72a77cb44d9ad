"""loss_anomaly: NaN/inf loss, a loss that collapses to exactly zero, a frozen grad norm."""

from __future__ import annotations

import math
from typing import Any

from tunedeck.core.diagnose.finding import Finding

FROZEN_STEPS = 5   # identical grad norms in a row before we call them frozen
ZERO_STEPS = 3


def loss_findings(recs: list[dict[str, Any]], source: str = "") -> list[Finding]:
    out: list[Finding] = []
    bad = [r for r in recs if isinstance(r.get("loss"), float) and not math.isfinite(r["loss"])]
    if bad:
        first = bad[0]
        i = recs.index(first)   # the step before it, as evidence of where it turned
        out.append(Finding(
            category="loss_anomaly", severity="error",
            summary=f"loss is {first['loss']} from step {first['step']} "
                    f"({len(bad)} of {len(recs)} steps)",
            cause="The loss became NaN/inf: the learning rate is too high, fp16 overflowed, or "
                  "a batch has no target tokens (all labels masked) or bad values.",
            fix="Lower the learning rate or add warmup, clip gradients (max_grad_norm 1.0), "
                "train in bf16 instead of fp16, and check the data around that step for "
                "empty or truncated answers.",
            evidence=[_fmt(r) for r in recs[max(i - 1, 0):i] + bad[:4]],
            source=source, t=first.get("t")))
    run = _longest_run(recs, lambda r: r.get("loss") == 0.0)
    had_nonzero = any(isinstance(r.get("loss"), (int, float)) and r["loss"] not in (0, 0.0)
                      for r in recs)
    if run and len(run) >= ZERO_STEPS and had_nonzero:
        out.append(Finding(
            category="loss_anomaly", severity="warning",
            summary=f"loss collapsed to exactly 0 at step {run[0]['step']} "
                    f"({len(run)} steps)",
            cause="A loss of exactly zero means nothing is being learned from: all labels are "
                  "masked (-100), the loss is computed on padding, or the model saw the "
                  "answers in its input.",
            fix="Check the label masking / template (ms-swift: --loss_scale, the chat "
                "template), and that max_length does not truncate every answer.",
            evidence=[_fmt(r) for r in run[:4]], source=source, t=run[0].get("t")))
    run = _frozen(recs)
    if run:
        out.append(Finding(
            category="loss_anomaly", severity="warning",
            summary=f"grad norm frozen at {run[0]['grad_norm']} from step {run[0]['step']} "
                    f"({len(run)} steps)",
            cause="The gradient norm is identical step after step: no parameter is being "
                  "trained (all frozen, LoRA not attached, learning rate 0) or the loss does "
                  "not depend on the inputs.",
            fix="Check trainable parameters (LoRA target modules exist in the model), the "
                "learning-rate schedule, and that gradients flow (no .detach() / no_grad).",
            evidence=[_fmt(r) for r in run[:4]], source=source, t=run[0].get("t")))
    return out


def _fmt(r: dict[str, Any]) -> str:
    keys = ("step", "loss", "grad_norm", "learning_rate")
    return " ".join(f"{k}={r[k]}" for k in keys if k in r)


def _longest_run(recs, pred) -> list[dict[str, Any]]:
    best: list = []
    cur: list = []
    for r in recs:
        if pred(r):
            cur.append(r)
            if len(cur) > len(best):
                best = list(cur)
        else:
            cur = []
    return best


def _frozen(recs) -> list[dict[str, Any]]:
    best: list = []
    cur: list = []
    for r in recs:
        g = r.get("grad_norm")
        if isinstance(g, (int, float)) and cur and cur[-1].get("grad_norm") == g:
            cur.append(r)
        else:
            cur = [r] if isinstance(g, (int, float)) else []
        if len(cur) > len(best):
            best = list(cur)
    return best if len(best) >= FROZEN_STEPS else []
