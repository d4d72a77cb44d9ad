"""One head chunk's cross-entropy math, from the logits to the summed loss and
d(loss)/d(logits), fused by torch.compile wherever the run compiles its layers.

Eager, the chunk costs a log-softmax that writes fp32 log-probs, an exp that reads them back and
writes the gradient, a scatter and a masking pass: on the 7B preset's 3 × 2,731 × 152,064 logits
per micro-batch that is ~50 ms a step on an H200 (docs/benchmarks.md). Written for Inductor, the
logits are read twice (max/log-sum-exp, then the exp pass writing the gradient in the matmul
dtype) and fp32 logits are never materialised (timed by bench/ce_chunk.py).

`chunk_loss_grad` chooses: the compiled math where the run's train.compile applies (the trainer
says so through `follow_compile`; compile_wanted's rule: CUDA, or any device when
TUNEDECK_COMPILE_BACKEND names a backend, as tests do), unless TUNEDECK_FUSED_CE=0. On the 7B
preset it gave +3.5 % tokens/s and 2.3 GiB less in bf16, +3.8 % in fp8 (H200, docs/benchmarks.md).
A compile that fails turns the fused path off for the process, with one warning; the step goes
on eager.
"""

from __future__ import annotations

import os
import sys

import torch

from .fastpath import compile_wanted, error_text, is_compile_error

FUSED_ENV = "TUNEDECK_FUSED_CE"

_compiled: dict[str, object] = {}  # backend → the compiled function, made at first use
_failed: str | None = None  # why compiling failed (then eager for the rest of the process)
_compile = True  # the run's train.compile (follow_compile)
_backend: object = None  # a backend given by use_backend (fault injection), else by name


def ce_grad_chunk(hc, w, tt, valid, dt, grad: bool):
    """(summed loss in fp32, g) of the chunk's logits hc @ wᵀ, eager.

    The logits live only as log_softmax's input (its fp32 result replaces them). tt: targets
    with IGNORE clamped to a valid column; valid: tt's rows that count (None: all do).
    g = softmax - onehot in `dt` (None unless grad), softmax in fp32, the target column p - 1
    computed in fp32 and rounded once (as autograd's fp32 path does), rows not valid 0."""
    logp = torch.log_softmax(hc @ w.t(), dim=-1, dtype=torch.float32)
    picked = logp.gather(1, tt.unsqueeze(1)).squeeze(1)  # log p(target), fp32
    if valid is not None:
        picked = picked * valid
    loss = -picked.sum()
    if not grad:
        return loss, None
    # softmax, computed in fp32 and stored in the matmul dtype by one kernel
    g = torch.exp(logp, out=torch.empty(logp.shape, dtype=dt, device=hc.device))
    del logp
    g.scatter_(1, tt.unsqueeze(1), (picked.exp() - 1).to(dt).unsqueeze(1))
    if valid is not None:
        g.mul_(valid.unsqueeze(1).to(dt))
    return loss, g


def _ce_grad_fused(hc, w, tt, valid, dt, grad: bool):
    """ce_grad_chunk written for Inductor: no scatter or in-place pass over g, so the softmax,
    the target column and the row mask fuse into the one kernel that writes g. The matmul
    stays ATen's (an extern kernel in the graph)."""
    x = (hc @ w.t()).float()
    logp = x - torch.logsumexp(x, dim=-1, keepdim=True)
    picked = logp.gather(1, tt.unsqueeze(1)).squeeze(1)
    if valid is not None:
        picked = torch.where(valid, picked, 0.0)
    loss = -picked.sum()
    if not grad:
        return loss, None
    p = logp.exp()
    col = torch.arange(x.shape[1], device=x.device)
    g = torch.where(col == tt.unsqueeze(1), p - 1, p)
    if valid is not None:
        g = torch.where(valid.unsqueeze(1), g, 0.0)
    return loss, g.to(dt)


def follow_compile(flag: bool) -> None:
    """The run's train.compile: false keeps the loss eager too."""
    global _compile
    _compile = bool(flag)


def fused_wanted(device: torch.device) -> bool:
    """Not turned off (TUNEDECK_FUSED_CE=0), not failed, and train.compile applies here
    (compile_wanted's rule: CUDA, or any device under TUNEDECK_COMPILE_BACKEND)."""
    if _failed is not None or os.environ.get(FUSED_ENV, "1") == "0":
        return False
    return compile_wanted(_compile, device)


def use_backend(backend) -> None:
    """Compile with this backend (a callable) instead of the named one: tests' faults."""
    global _backend
    _backend = backend
    _compiled.clear()


def _compiled_fn():
    backend = _backend or os.environ.get("TUNEDECK_COMPILE_BACKEND") or "inductor"
    fn = _compiled.get(backend)
    if fn is None:
        fn = _compiled[backend] = torch.compile(_ce_grad_fused, backend=backend)
    return fn


def chunk_loss_grad(hc, w, tt, valid, dt, grad: bool):
    """ce_grad_chunk, compiled where fused_wanted says so. Called from eager code only (the
    head's autograd.Function, outside the compiled decoder layers)."""
    global _failed
    if torch.compiler.is_compiling() or not fused_wanted(hc.device):
        return ce_grad_chunk(hc, w, tt, valid, dt, grad)
    from torch._dynamo import maybe_mark_dynamic

    # Chunks differ by a row and the last may be smaller: one graph for every row count.
    for x in (hc, tt) if valid is None else (hc, tt, valid):
        maybe_mark_dynamic(x, 0)
    try:
        return _compiled_fn()(hc, w, tt, valid, dt, grad)
    except Exception as e:
        if not is_compile_error(e):
            raise
        _failed = error_text(e)
        print(
            f"warning: the fused output-head loss did not compile ({_failed}); "
            f"it runs eager ({FUSED_ENV}=0 skips the attempt)",
            file=sys.stderr,
            flush=True,
        )
    return ce_grad_chunk(hc, w, tt, valid, dt, grad)


def reset() -> None:
    """Forget compiled functions, a failure, train.compile's setting and a backend (tests)."""
    global _failed, _compile, _backend
    _compiled.clear()
    _failed, _compile, _backend = None, True, None
