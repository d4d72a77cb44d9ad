"""Step lines of training frameworks that print their own text, each turned into the plain
record keys (`step, loss, learning_rate, grad_norm, max_steps, step_s, epoch`):

    Megatron-LM / Megatron-LLM / Megatron-DeepSpeed
        iteration      122/  250000 | consumed samples: ... | elapsed time per iteration (ms):
        865.2 | learning rate: 9.150E-06 | ... | lm loss: 2.504220E+00 | ... | grad norm: 0.231 |
    DeepSpeed's engine          steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 15.6
    torchtune                   1|55|Loss: 1.0744975805282593:  54%|█████▍    | 55/101 [...]
    litgpt                      iter 100 step 50: loss 3.7451, iter time: 187.97ms
                                Epoch 1 | iter 46 step 1 | loss train: 3.724, val: n/a | ...
    lit-llama                   iter 10: loss 1.2345, time: 123.45ms
    Lightning's rich bar        Epoch 0/9 ━━━━━━━━ 450/1000 0:01:23 • 0:01:42 5.37it/s v_num: 3
                                train_loss: 2.340
    a dict printed after text   epoch 0 step 10: {'train_loss': 1.23, 'lr': 1e-05}
    mmcv / mmengine             Epoch [1][100/62598]  lr: 1.000e-03, ..., loss: 1.9091, grad_norm: nan
    loss, then a step           ... Loss nan   LearningRate 0.001000   Epoch: 0   Global Step: 20
"""

from __future__ import annotations

import re
from typing import Any

from tunedeck.core.ingest.parsers.pydict import parse_dict_line

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"

_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_MEGATRON_FIELDS = {
    "lm loss": "loss",
    "lm_loss": "loss",
    "loss": "loss",
    "learning rate": "learning_rate",
    "grad norm": "grad_norm",
    "elapsed time per iteration (ms)": "step_ms",
}
_FIELD = re.compile(r"\|\s*([a-z][a-z ()/_-]*?)\s*:\s*(" + _NUM + r")\s*(?=\||$)", re.I)

_DS_STEPS = re.compile(
    r"\bsteps: (\d+) loss: (" + _NUM + r")(?: iter time \(s\): (" + _NUM + r"))?"
)
_TORCHTUNE = re.compile(r"(?:^|[\s:\]])(\d+)\|(\d+)\|Loss: (" + _NUM + r")")
_LITGPT = re.compile(
    r"\biter (\d+)(?: \|)? step (\d+)(?::| \|) loss(?: train(?: \(curr\))?)?:? "
    r"(" + _NUM + r")",
    re.I,
)
_LITLLAMA = re.compile(r"^iter (\d+): loss (" + _NUM + r")")
_ITER_MS = re.compile(r"iter time: (" + _NUM + r") ?ms")
_RICH_BAR = re.compile(
    r"Epoch (\d+)/\d+\s+\S+\s+(\d+)/(\d+)\s.*?\btrain_loss(?:_step)?:\s*(" + _NUM + r")"
)
# mmcv / mmengine runners: `Epoch [1][100/62598]\tlr: ..., loss: 1.9091` (epoch-local
# iterations: the run's step counts the epochs before), `Iter(train) [  100/160000]  ... loss: 2.3`
_MM_EPOCH = re.compile(r"\bEpoch(?:\(train\))? *\[(\d+)\] *\[ *(\d+)/(\d+)\]")
_MM_ITER = re.compile(r"\bIter(?:\(train\))? *\[ *(\d+)/(\d+)\]")
_MM_LOSS = re.compile(r"\b(?:total_)?loss: (" + _NUM + r")")
_MM_EXTRA = {
    "grad_norm": re.compile(r"\bgrad_norm: (" + _NUM + r")"),
    "learning_rate": re.compile(r"\blr: (" + _NUM + r")"),
}
# MetricLogger style (detectron2, DINO, timm scripts): `Training  [   40/5000000]  ... loss: x`
_BRACKET_STEP = re.compile(r"\[ *(\d+)/(\d+)\]")
# a step (iteration) named before its loss: `Training Iteration: 3272  step_loss : 0.48`
_STEP_FIRST = re.compile(
    r"\b(?:global[ _]?step|step|iteration|iter)\b\s*[=:]?\s*(\d+)\b"
    r"(?![./])(?:(?!\b(?:global[ _]?step|step|iteration|iter)\b).)*?"
    r"\b(?:\w+_)?loss\s*[=:]\s*(" + _NUM + r")\b",
    re.I,
)
# fairseq's progress lines: `| epoch 010:  4000 / 8223 loss=0.91 (1.48), ..., gnorm=2.16`
_FAIRSEQ = re.compile(r"\bepoch (\d+):? +(\d+) / (\d+) loss=(" + _NUM + r")")
_GNORM = re.compile(r"\bgnorm=(" + _NUM + r")")
# anything else that names a loss and then a step: `Loss nan ... Global Step: 20`
_LOSS_FIRST = re.compile(
    r"\bloss\b[\s=:]+(" + _NUM + r")\b.*?\b(?:global[ _]?step|step|iteration)"
    r"\b[\s=:]+(\d+)(?![\d.e])",
    re.I,
)
_TEXT_STEP = re.compile(r"\b(?:step|global_step|iter|iteration)[\s=:]+(\d+)", re.I)


def parse_framework_line(s: str) -> dict[str, Any] | None:
    """The record of one step line of a framework above, or None."""
    if "iteration" in s and "|" in s:
        rec = _megatron(s)
        if rec is not None:
            return rec
    if "Loss:" in s and "|" in s:
        m = _TORCHTUNE.search(s)
        if m:
            return {"step": int(m[2]), "loss": float(m[3]), "epoch": int(m[1])}
    if "steps: " in s:
        m = _DS_STEPS.search(s)
        if m:
            rec = {"step": int(m[1]), "loss": float(m[2])}
            if m[3]:
                rec["step_s"] = float(m[3])
            return rec
    if s.startswith(("iter ", "Epoch ", "Ep ")) and "loss" in s:
        m = _LITGPT.search(s)
        if m:
            rec = {"step": int(m[2]), "loss": float(m[3]), "iter": int(m[1])}
            t = _ITER_MS.search(s)
            if t:
                rec["step_s"] = float(t[1]) / 1000
            return rec
        m = _LITLLAMA.match(s)
        if m:
            return {"step": int(m[1]), "loss": float(m[2])}
    if "train_loss" in s and "Epoch" in s:
        m = _RICH_BAR.search(s)
        if m:
            epoch, n, total = int(m[1]), int(m[2]), int(m[3])
            return {"step": epoch * total + n, "loss": float(m[4]), "epoch": epoch}
    if "[" in s and ("Epoch" in s or "Iter" in s or "/" in s) and "loss: " in s:
        rec = _mm(s)
        if rec is not None:
            return rec
    if "epoch " in s and "loss=" in s:
        m = _FAIRSEQ.search(s)
        if m:
            epoch, n, per_epoch = int(m[1]), int(m[2]), int(m[3])
            rec = {"step": (epoch - 1) * per_epoch + n, "loss": float(m[4]), "epoch": epoch}
            g = _GNORM.search(s)
            if g:
                rec["grad_norm"] = float(g[1])
            return rec
    brace = s.find("{")
    if brace > 0 and s.rstrip().endswith("}"):
        return _inline_dict(s, brace)
    if "oss" in s and "%|" not in s:  # (a progress bar's postfix is tqdm.py's)
        m = _LOSS_FIRST.search(s)
        if m:
            return {"step": int(m[2]), "loss": float(m[1])}
        m = _STEP_FIRST.search(s) if "% " not in s else None
        if m:
            return {"step": int(m[1]), "loss": float(m[2])}
        if not _PERCENT.search(s):  # progress bars are tqdm.py's, even without bars
            return _key_values(s)
    return None


# -- the last resort: a line of `key: value` pairs naming a training loss and a counter ------
# (YOLOX, NeMo, speechbrain, timm-style `Epoch: [e/E][i/N] ... Loss x (avg)`, a script's own
# `epoch 0 | batch 500 | loss: 0.12`). A loss of a part (cls_loss, iou_loss) or of evaluation
# (val_loss, valid loss) is never taken for the training loss.
_KV_LOSS = re.compile(
    r"(?:\b(?P<pre>[A-Za-z]+)[ _])?(?P<name>[A-Za-z_]*loss)\b[ \t]*[:=]?[ \t]*"
    r"(?P<v>" + _NUM + r")(?![\w.])",
    re.I,
)
_TRAIN_LOSS = {"loss", "total_loss", "train_loss", "reduced_train_loss", "lm_loss", "training_loss"}
_NOT_TRAIN = ("val", "valid", "eval", "test", "dev")
_KV_STEPS = (  # most specific first: (pattern, "global" or "local" counter)
    (re.compile(r"\bglobal[ _]?step\b\s*[:=]?\s*(\d+)", re.I), "global"),
    (re.compile(r"\bsteps?\b\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?", re.I), "global"),
    (re.compile(r"\b(?:iter(?:ation)?|it)\b\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?", re.I), "local"),
    (re.compile(r"\bbatch\b\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?", re.I), "local"),
    (re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\]\s*\[\s*(\d+)\s*/\s*(\d+)\]"), "epoch+local"),
)
_PERCENT = re.compile(r"\d%")
_KV_EPOCH = re.compile(r"\bepoch\b\s*[:=]?\s*\[?\s*(\d+)(?:\s*/\s*\d+)?", re.I)


def _key_values(s: str) -> dict[str, Any] | None:
    loss = None
    for m in _KV_LOSS.finditer(s):
        pre, name = (m["pre"] or "").lower(), m["name"].lower()
        if any(w in pre or name.startswith(w) for w in _NOT_TRAIN):
            continue
        if name in _TRAIN_LOSS or (name == "loss" and pre in ("train", "training")):
            loss = float(m["v"])
            break
    if loss is None:
        return None
    epoch_m = _KV_EPOCH.search(s)
    for rx, kind in _KV_STEPS:
        m = rx.search(s)
        if not m:
            continue
        if kind == "epoch+local":
            epoch, n, per = int(m[1]), int(m[3]), int(m[4])
            return {"step": max(epoch - 1, 0) * per + n, "loss": loss, "epoch": epoch}
        n, per = int(m[1]), m[2] and int(m[2])
        if kind == "local" and per and epoch_m:  # an epoch's own count: the run's step
            epoch = int(epoch_m[1])
            return {"step": max(epoch - 1, 0) * per + n, "loss": loss, "epoch": epoch}
        return {"step": n, "loss": loss}
    if epoch_m:  # one line per epoch: the epoch is the step
        return {"step": int(epoch_m[1]), "loss": loss}
    return None


def _mm(s: str) -> dict[str, Any] | None:
    loss = _MM_LOSS.search(s)
    if not loss:
        return None
    m = _MM_EPOCH.search(s)
    if m:
        epoch, n, per_epoch = int(m[1]), int(m[2]), int(m[3])
        rec = {"step": (epoch - 1) * per_epoch + n, "loss": float(loss[1]), "epoch": epoch}
    elif m := _MM_ITER.search(s) or _BRACKET_STEP.search(s):
        rec = {"step": int(m[1]), "max_steps": int(m[2]), "loss": float(loss[1])}
    else:
        return None
    for key, rx in _MM_EXTRA.items():
        got = rx.search(s)
        if got:
            rec[key] = float(got[1])
    return rec


def _megatron(s: str) -> dict[str, Any] | None:
    m = _MEGATRON.search(s)
    if not m:
        return None
    rec: dict[str, Any] = {"step": int(m[1]), "max_steps": int(m[2])}
    for key, value in _FIELD.findall(s[m.end() - 1 :]):
        name = _MEGATRON_FIELDS.get(key.strip().lower())
        if name and name not in rec:
            rec[name] = float(value)
    if "step_ms" in rec:
        rec["step_s"] = rec.pop("step_ms") / 1000
    # a line without its loss still says how the gradients are (a NaN grad norm is the news)
    return rec if "loss" in rec or "grad_norm" in rec else None


def _inline_dict(s: str, brace: int) -> dict[str, Any] | None:
    """`epoch 0 step 10: {...}` (accelerate's print, a script's f-string)."""
    d = parse_dict_line(s[brace:])
    if not d:
        return None
    loss = next((d[k] for k in ("loss", "train_loss", "train/loss") if _is_num(d.get(k))), None)
    if loss is None:
        return None
    step = next(
        (
            d[k]
            for k in ("step", "global_step", "train/global_step", "iteration", "iter")
            if _is_num(d.get(k))
        ),
        None,
    )
    if step is None:
        m = _TEXT_STEP.search(s[:brace])
        if not m:
            return None
        step = int(m[1])
    rec: dict[str, Any] = {"step": int(step), "loss": float(loss)}
    for src, dst in (
        ("lr", "learning_rate"),
        ("learning_rate", "learning_rate"),
        ("grad_norm", "grad_norm"),
        ("epoch", "epoch"),
    ):
        if _is_num(d.get(src)) and dst not in rec:
            rec[dst] = d[src]
    return rec


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
