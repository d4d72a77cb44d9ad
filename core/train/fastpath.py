"""What keeps the built-in trainer fast on a GPU: torch.compile of the decoder layers with few
batch shapes (bucketed padded lengths, fixed-length packed rows), a cap on recompiles and a clean
fallback to eager, and document-aware (varlen) attention for packed rows.

Compiling happens at the first forward of each new batch shape, inside a step: the trainer asks
`LayerCompiler.before` for every micro-batch, and it emits a "phase" event ("compiling") when a
shape is new, so the monitor shows why the first step takes 20-40 s. Graphs: the layers share
one code object, so one graph serves all of them; dynamo's automatic dynamic shapes make the
second length a dynamic graph that later lengths reuse, so graphs stay ≤ the number of buckets.
"""

from __future__ import annotations

import inspect
import os
import sys
import time

import torch

# Padded lengths: 128 · {1, 1.5} · 2^k up to max_length (≤ 50 % padding added, ~17 % on
# average for log-normal lengths), so a compiled model sees at most ~2·log2(max/128)+1 shapes.
BUCKET_SMALLEST = 128
# First compile of a 7B decoder layer on H200, measured (docs/benchmarks.md); later shapes
# are estimated from the first one's measured time.
FIRST_COMPILE_EST_S = 25.0
PACKED_ATTN = "tunedeck_packed"


def length_buckets(max_length: int, smallest: int = BUCKET_SMALLEST) -> list[int]:
    """The padded lengths a batch may have, ascending, max_length last."""
    out, b = [], smallest
    while b < max_length:
        out.append(b)
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 128, 192, 256, 384, 512, ...
    out.append(max_length)
    return out


def bucket_length(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds n tokens (n itself past the last bucket)."""
    for b in buckets:
        if n <= b:
            return b
    return n


# -- compile ------------------------------------------------------------------------------

_COMPILE_ERROR_NAMES = {
    "BackendCompilerFailed",
    "Unsupported",
    "InternalTorchDynamoError",
    "TorchRuntimeError",
    "LoweringException",
    "InductorError",
    "UserError",
    "RestartAnalysis",
}


def is_compile_error(e: BaseException) -> bool:
    """Did torch.compile itself fail (dynamo, AOT, inductor, a backend), rather than the
    model's computation? Walks the exception's causes."""
    seen = 0
    while e is not None and seen < 8:
        mod = type(e).__module__ or ""
        if (
            mod.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))
            or type(e).__name__ in _COMPILE_ERROR_NAMES
        ):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def error_text(e: BaseException) -> str:
    """One line: the exception and its root cause (dynamo's own first line says only
    "backend='...' raised:")."""
    root, seen = e, 0
    while seen < 8:
        nxt = getattr(root, "inner_exception", None) or root.__cause__
        if nxt is None or nxt is root:
            break
        root, seen = nxt, seen + 1
    text = f"{type(e).__name__}: {str(e).strip()}".splitlines()[0]
    if root is not e:
        text += f" {type(root).__name__}: " + (str(root).strip().splitlines() or [""])[0]
    return text[:300]


def compile_wanted(flag: bool, device: torch.device) -> bool:
    """train.compile applies where it pays: CUDA. TUNEDECK_COMPILE_BACKEND (tests: "eager",
    or a failing backend) compiles on any device."""
    if not flag:
        return False
    return device.type == "cuda" or bool(os.environ.get("TUNEDECK_COMPILE_BACKEND"))


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def lean_saves(on: bool = True) -> None:
    """Let the compiled layers recompute pointwise results that backward reads through a matmul.

    By default the partitioner saves any result backward must materialize anyway: the MLP's
    SiLU(gate)·up (the down projection's input, which its LoRA gradient multiplies) and the
    normalized inputs beside the residuals they come from. Recomputed from gate, up and the
    residuals, a 7B decoder layer saves 107 kB a token instead of 159 kB (bench/saved_layer.py);
    with one graph per layer (LayerCompiler) the H200 preset peaks at 41.9 GiB instead of 53.1
    at the same tokens/s (docs/benchmarks.md). TUNEDECK_LEAN_SAVES=0 keeps torch's defaults."""
    import torch._functorch.config as fconfig

    if hasattr(fconfig, "ban_recompute_materialized_backward"):
        fconfig.ban_recompute_materialized_backward = not on


class LayerCompiler:
    """torch.compile per decoder layer, shapes watched, failures turned into eager.

    events: an EventWriter (or anything with emit(kind, **fields)); None in unit tests.
    """

    def __init__(
        self,
        layers,
        max_shapes: int,
        events=None,
        rank: int = 0,
        backend: str | None = None,
        mode: str | None = None,
        lean: bool = False,
    ):
        self.layers = list(layers)
        self.lean = lean
        self.events, self.rank = events, rank
        self.max_shapes = max_shapes
        self.backend = backend or os.environ.get("TUNEDECK_COMPILE_BACKEND") or "inductor"
        self.mode = mode if mode is not None else (os.environ.get("TUNEDECK_COMPILE_MODE") or None)
        self.enabled = False
        self.failed: str | None = None
        self.shapes: set[tuple] = set()
        self._compiling: tuple | None = None
        self._t0 = 0.0
        self.compile_s: list[float] = []

    def setup(self) -> None:
        import torch._dynamo

        cfg = torch._dynamo.config
        # The cap (per shape: train and eval, first layer and the rest): a shape past it runs eager (dynamo's own fallback), never a compile per batch.
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 4 * self.max_shapes + 2))
        if self.lean and os.environ.get("TUNEDECK_LEAN_SAVES", "1") != "0":
            # Called inside DDP's forward, dynamo splits each layer's graph at DDP's bucket
            # boundaries (its first bucket is 1 MiB; a 7B layer's LoRA r=16 is ~6 MB), and the
            # MLP's SiLU(gate)·up became a graph input that had to be saved. A layer's backward
            # ends before the next one's starts, so its gradients' all-reduce still overlaps.
            torch._dynamo.config.optimize_ddp = False
            lean_saves(True)
        budget = os.environ.get("TUNEDECK_ACT_BUDGET")
        if budget:  # a measurement switch: < 1 makes the partitioner recompute to save memory
            import torch._functorch.config as fconfig

            fconfig.activation_memory_budget = float(budget)
        kw = {"backend": self.backend}
        if self.mode and self.backend == "inductor":
            kw["mode"] = self.mode
        for layer in self.layers:
            layer.compile(**kw)
        self.enabled = True

    # the trainer calls these around each micro-batch's forward/backward
    def before(self, key: tuple, step: int) -> None:
        if not self.enabled or key in self.shapes:
            return
        self.shapes.add(key)
        if self._compiling is None:
            self._compiling, self._t0 = key, time.perf_counter()
            est = self.compile_s[0] if self.compile_s else FIRST_COMPILE_EST_S
            self._emit(phase="compiling", step=step, est_s=round(est, 1), shape=list(key[:2]))
            if self.rank == 0:
                print(
                    f"compiling the model for batch shape {tuple(key[:2])} (~{est:.0f} s)",
                    flush=True,
                )

    def after_step(self, step: int, step_s: float) -> None:
        """After the step that compiled: its time (compile + one step) and the graph count."""
        if self._compiling is None:
            return
        self._compiling = None
        self.compile_s.append(time.perf_counter() - self._t0)
        self._emit(
            phase="training",
            step=step,
            compile_s=round(self.compile_s[-1], 1),
            graphs=graphs_compiled(),
        )

    def fall_back(self, err: BaseException, step: int) -> None:
        """Compiling failed: run eager from now on, and say so (one line, and a phase event
        the diagnosis turns into a finding)."""
        import torch._dynamo

        for layer in self.layers:
            layer._compiled_call_impl = None  # nn.Module.compile's hook: back to the module
        torch._dynamo.reset()
        self.enabled = False
        self._compiling = None
        msg = error_text(err)
        self.failed = msg
        self._emit(phase="eager_fallback", step=step, error=msg)
        print(
            f"warning: torch.compile failed ({msg}); training goes on without compiling "
            f"(slower; set train.compile = false to skip the attempt)",
            file=sys.stderr,
            flush=True,
        )

    def _emit(self, **fields) -> None:
        if self.events is not None:
            self.events.emit("phase", **fields)


# -- packed (varlen) attention ------------------------------------------------------------

_VARLEN_KW: dict | None = None  # keyword arguments varlen_attn takes here (set by enable)


def _cu_doc_ids(cu: torch.Tensor, total: int) -> torch.Tensor:
    lens = (cu[1:] - cu[:-1]).long()
    return torch.repeat_interleave(
        torch.arange(lens.numel(), device=cu.device), lens, output_size=total
    )


def reference_packed_attention(q, k, v, cu, scale):
    """(T, H, D) attention within each document of cu, causal: SDPA with a block-diagonal
    mask. Exact, quadratic in the whole row: the CPU path and the GPU check."""
    T = q.shape[0]
    doc = _cu_doc_ids(cu, T)
    pos = torch.arange(T, device=q.device)
    mask = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1)


def _varlen(q, k, v, cu, max_len: int, scale):
    from torch.nn.attention.varlen import varlen_attn

    kw = dict(_VARLEN_KW)
    if q.shape[1] != k.shape[1] and not kw.pop("_gqa_native", False):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    kw.pop("_gqa_native", None)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **kw)


def packed_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs
):
    """A transformers attention function for one packed row (batch 1): each document attends
    causally to itself only, from cu_seq_lens_q (cumulative document lengths)."""
    cu = kwargs["cu_seq_lens_q"]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
    if query.is_cuda and _VARLEN_KW is not None:
        out = _varlen(q, k, v, cu, int(kwargs["max_length_q"]), scaling)
    else:
        out = reference_packed_attention(q, k, v, cu, scaling)
    return out.unsqueeze(0), None  # (1, T, H, D), as transformers' own functions return


def _varlen_kwargs() -> dict | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    kw: dict = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    kw["_gqa_native"] = "enable_gqa" in params
    return kw


def check_varlen(device: torch.device) -> str | None:
    """Set up the varlen kernel on this GPU and check it against the reference on a small
    packed row (GQA, three documents); the reason it is not used, or None."""
    global _VARLEN_KW
    _VARLEN_KW = None
    if device.type != "cuda":
        return "not a GPU"
    kw = _varlen_kwargs()
    if kw is None:
        return "torch has no torch.nn.attention.varlen"
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(300, 8, 64, generator=g).to(device, torch.bfloat16)
    k = torch.randn(300, 2, 64, generator=g).to(device, torch.bfloat16)
    v = torch.randn(300, 2, 64, generator=g).to(device, torch.bfloat16)
    cu = torch.tensor([0, 100, 250, 300], dtype=torch.int32, device=device)
    for gqa_native in (True, False) if kw["_gqa_native"] else (False,):
        _VARLEN_KW = dict(kw, _gqa_native=gqa_native)
        if not gqa_native:
            _VARLEN_KW.pop("enable_gqa", None)
        try:
            got = _varlen(q, k, v, cu, 150, None).float()
            want = reference_packed_attention(q, k, v, cu, None).float()
            if torch.allclose(got, want, atol=2e-2, rtol=2e-2):
                return None
            err = f"differs from the reference (max {(got - want).abs().max().item():.3g})"
        except Exception as e:  # an older torch or GPU: the reason is reported, sdpa stays
            err = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    _VARLEN_KW = None
    return err


def use_packed_attention(model) -> None:
    """Switch the model's attention to `packed_attention`. transformers makes no mask for an
    attention function it has no mask function for, so no T×T mask is built either."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTN, packed_attention)
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    for cfg in {id(c): c for c in (lm.config, getattr(lm.model, "config", lm.config))}.values():
        cfg._attn_implementation = PACKED_ATTN
