"""How ranks share the model (DDP or FSDP2), the loss module they run, and full state dicts.

The loss is computed inside the wrapped module (`CausalLMLoss`) so DDP/FSDP2 hooks see one
forward, and so the output head can be applied in chunks: at 2k tokens × 152k vocabulary the
fp32 logits alone are ~1.2 GiB per sample; `linear_cross_entropy` keeps one chunk alive and
makes the head's gradients while the chunk is there (no recomputation).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .ce_kernel import chunk_loss_grad

IGNORE = -100
# Elements of fp32 logits per head chunk (2 GiB): big enough that each chunk's matmuls run at
# full speed, small enough that one chunk's vocabulary-wide tensors are a few GiB.
CHUNK_ELEMS = 2**29


def base_causal_lm(model: nn.Module) -> nn.Module:
    """The transformers *ForCausalLM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _ce(head: nn.Module, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), t, ignore_index=IGNORE, reduction="sum")


def rows_per_chunk(n: int, vocab: int, chunk: int = 0) -> int:
    """`chunk` if set, else balanced chunks of at most CHUNK_ELEMS logits
    (8188 rows × 152k vocabulary → 3 × 2730 rows, not 3530 + 3530 + 1128)."""
    if chunk > 0:
        return chunk
    pieces = max(1, -(-n * vocab // CHUNK_ELEMS))
    return max(1, -(-n // pieces))


class _LinearCE(torch.autograd.Function):
    """Summed cross-entropy of (h @ Wᵀ) against t, chunk by chunk, gradients made in forward.

    Per chunk, forward computes the fp32 log-softmax, the chunk's loss and
    d(loss)/d(logits) = softmax - onehot (`ce_kernel.chunk_loss_grad`: on CUDA two fused
    kernels that read the logits twice), and folds that at once into d/dh (and d/dW when the
    head trains); backward only scales the stored gradients by the incoming scalar. So at most
    one chunk of vocabulary-wide tensors is alive, the head matmul is never recomputed (the
    checkpointed chunks cost a second head forward, ~3 % of a 7B LoRA step), and each logit
    costs ~10 bytes of memory traffic (~14 eager) instead of ~40 for materialised logits +
    autograd.
    """

    @staticmethod
    def forward(ctx, h, weight, t, rows, grad_h_wanted, grad_w_wanted, all_valid, dt):
        n = h.shape[0]
        hc_all, w = h.to(dt), weight.to(dt)
        # Under fp16 the loss is scaled by GradScaler: keep d/dh in fp32 so it cannot overflow.
        gdt = torch.float32 if dt == torch.float16 else dt
        grad_h = torch.empty((n, h.shape[1]), dtype=gdt, device=h.device) if grad_h_wanted else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
            if grad_w_wanted
            else None
        )
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, n, rows):
            hc, tc = hc_all[s : s + rows], t[s : s + rows]
            k = hc.shape[0]
            valid = None if all_valid else tc != IGNORE
            tt = tc if valid is None else tc.clamp(min=0)
            want = grad_h is not None or grad_w is not None
            loss, g = chunk_loss_grad(hc, w, tt, valid, dt, want)
            total = total + loss
            if not want:
                continue
            if grad_h is not None:
                if gdt == dt:
                    torch.mm(g, w, out=grad_h[s : s + k])
                else:
                    grad_h[s : s + k] = g @ w
            if grad_w is not None:
                grad_w.add_(g.t() @ hc)  # fp32 sum over chunks
            del g
        ctx.save_for_backward(*(x for x in (grad_h, grad_w) if x is not None))
        ctx.has = (grad_h is not None, grad_w is not None)
        ctx.dtypes = (h.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        gh = (saved.pop(0) * grad_out).to(ctx.dtypes[0]) if ctx.has[0] else None
        gw = (saved.pop(0) * grad_out).to(ctx.dtypes[1]) if ctx.has[1] else None
        return gh, gw, None, None, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, t: torch.Tensor, chunk: int = 0, all_valid: bool = False
) -> torch.Tensor:
    """sum over rows of CE(h @ weightᵀ, t), ignoring t == IGNORE (all_valid: caller knows
    there is none, which saves a masking pass). Matmuls run in the autocast dtype if autocast
    is on (else the weight's), the softmax in fp32."""
    dev = h.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype
    grad = torch.is_grad_enabled()
    rows = rows_per_chunk(h.shape[0], weight.shape[0], chunk)
    with torch.autocast(dev, enabled=False):
        return _LinearCE.apply(
            h,
            weight,
            t,
            rows,
            grad and h.requires_grad,
            grad and weight.requires_grad,
            all_valid,
            dt,
        )


class CausalLMLoss(nn.Module):
    """forward(input_ids, targets, attention_mask|position_ids, label_pos) → summed token loss.

    label_pos: flat positions (row-major over the batch) whose target is not IGNORE, computed
    by the caller on the CPU copy (no GPU sync). The head then runs on those rows only: on chat
    data that skips the prompt and padding, often most of the tokens.

    A plain nn.Linear head (frozen in LoRA, or trained) goes through `linear_cross_entropy`
    in chunks of `chunk` rows (0 = automatic). Any other head (e.g. LoRA-adapted lm_head) is
    applied whole when small, else in checkpointed chunks.
    """

    def __init__(self, model: nn.Module, chunk: int = 0):
        super().__init__()
        self.model = model
        self.chunk = chunk

    def forward(
        self, input_ids, targets, attention_mask=None, position_ids=None, label_pos=None, **attn_kw
    ):
        """attn_kw: what the attention function needs besides the mask (packed rows:
        cu_seq_lens_q/k, max_length_q/k); transformers passes it down to every layer."""
        lm = base_causal_lm(self.model)
        h = lm.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **attn_kw,
        ).last_hidden_state
        h, t = h.flatten(0, 1), targets.flatten()
        if label_pos is not None:
            h, t = h.index_select(0, label_pos), t.index_select(0, label_pos)
        head = lm.lm_head
        if type(head) is nn.Linear and head.bias is None:
            return linear_cross_entropy(
                h, head.weight, t, self.chunk, all_valid=label_pos is not None
            )
        vocab = head.out_features
        chunk = rows_per_chunk(h.shape[0], vocab, self.chunk)
        if chunk >= h.shape[0]:
            return _ce(head, h, t)
        total = h.new_zeros((), dtype=torch.float32)
        for s in range(0, h.shape[0], chunk):
            total = total + checkpoint(
                _ce, head, h[s : s + chunk], t[s : s + chunk], use_reentrant=False
            )
        return total


def decoder_layers(model: nn.Module):
    return base_causal_lm(model).model.layers


def wrap(
    module: CausalLMLoss,
    strategy: str,
    device: torch.device,
    world: int,
    dtype: torch.dtype,
    cpu_offload: bool = False,
) -> nn.Module:
    """DDP, or FSDP2: fully_shard each decoder layer, then the root (embeddings, norm, head)."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Gradients as views into the all-reduce buckets: no copy in and out of the buckets,
        # and one gradient-sized buffer less. No buffer broadcast before every forward: a
        # causal LM's buffers (rotary inv_freq) are the same on every rank, and that
        # collective made a fast rank's forward (compute_s) wait for a starved peer, so the
        # straggler detector blamed the wrong rank. (torch 2.13 renamed the switch and warns
        # on every rank at the old name; the synced-at-init buffers are equal anyway.)
        import inspect

        no_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
            else {"broadcast_buffers": False}
        )
        return DDP(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
            **no_sync,
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    kw = {"mesh": mesh}
    if dtype != torch.float32:
        # Params gathered in the compute dtype (LoRA adapters are fp32, the base bf16: one
        # all-gather dtype), gradients reduced in fp32.
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for layer in decoder_layers(module.model):
        fully_shard(layer, **kw)
    fully_shard(module, **kw)
    return module


@contextmanager
def grad_sync(wrapped: nn.Module, enabled: bool):
    """Skip the gradient all-reduce/reduce-scatter on all but the last micro-step."""
    if enabled:
        yield
        return
    if hasattr(wrapped, "no_sync"):  # DDP
        with wrapped.no_sync():
            yield
        return
    wrapped.set_requires_gradient_sync(False)  # FSDP2
    try:
        yield
    finally:
        wrapped.set_requires_gradient_sync(True)


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2 DTensor grads → a DTensor norm
        norm = norm.full_tensor()
    return norm


# -- full state dicts (rank 0 holds them, on CPU) -----------------------------------------


def _opts(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def full_model_state(model: nn.Module, trainable_only: bool) -> dict:
    """Collective: every rank calls; rank 0 gets the whole (unsharded) state on CPU."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(
        model,
        options=_opts(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only),
    )


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(
        model, optimizer, options=_opts(full_state_dict=True, cpu_offload=True)
    )


def load_model_state(model: nn.Module, sd: dict) -> None:
    """Collective: rank 0 passes the full state, the others {}; it is broadcast and sharded."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(
        model, sd, options=_opts(full_state_dict=True, strict=False, broadcast_from_rank0=True)
    )


def load_optimizer_state(model: nn.Module, optimizer, sd: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, sd, options=_opts(full_state_dict=True, broadcast_from_rank0=True)
    )
