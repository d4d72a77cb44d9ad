"""How ranks share the model (DDP or FSDP2), the loss module they run, and full state dicts.

The loss is computed inside the wrapped module (`CausalLMLoss`) so DDP/FSDP2 hooks see one
forward, and so the output head can be applied in chunks: at 2k tokens × 152k vocabulary the
fp32 logits alone are ~1.2 GiB per sample; chunking with recomputation keeps one chunk alive.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE = -100
# Chunk the head when a micro-batch's fp32 logits would exceed this many elements (~1 GiB).
CHUNK_OVER = 2 ** 28


def base_causal_lm(model: nn.Module) -> nn.Module:
    """The transformers *ForCausalLM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _ce(head: nn.Module, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), t, ignore_index=IGNORE, reduction="sum")


class CausalLMLoss(nn.Module):
    """forward(input_ids, targets, attention_mask|position_ids) → summed token loss.

    `chunk` tokens per head application (0 = automatic: whole when small, 4096 when the fp32
    logits would be large). Each chunk is recomputed in backward instead of stored.
    """

    def __init__(self, model: nn.Module, chunk: int = 0):
        super().__init__()
        self.model = model
        self.chunk = chunk

    def forward(self, input_ids, targets, attention_mask=None, position_ids=None):
        lm = base_causal_lm(self.model)
        h = lm.model(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids, use_cache=False).last_hidden_state
        h, t = h.flatten(0, 1), targets.flatten()
        vocab = lm.lm_head.out_features
        chunk = self.chunk or (4096 if h.shape[0] * vocab > CHUNK_OVER else 0)
        if not chunk or chunk >= h.shape[0]:
            return _ce(lm.lm_head, h, t)
        total = h.new_zeros((), dtype=torch.float32)
        for s in range(0, h.shape[0], chunk):
            total = total + checkpoint(_ce, lm.lm_head, h[s:s + chunk], t[s:s + chunk],
                                       use_reentrant=False)
        return total


def decoder_layers(model: nn.Module):
    return base_causal_lm(model).model.layers


def wrap(module: CausalLMLoss, strategy: str, device: torch.device, world: int,
         dtype: torch.dtype, cpu_offload: bool = False) -> nn.Module:
    """DDP, or FSDP2: fully_shard each decoder layer, then the root (embeddings, norm, head)."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
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

    return get_model_state_dict(model, options=_opts(full_state_dict=True, cpu_offload=True,
                                                     ignore_frozen_params=trainable_only))


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=_opts(full_state_dict=True, cpu_offload=True))


def load_model_state(model: nn.Module, sd: dict) -> None:
    """Collective: rank 0 passes the full state, the others {}; it is broadcast and sharded."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, sd, options=_opts(full_state_dict=True, strict=False,
                                                  broadcast_from_rank0=True))


def load_optimizer_state(model: nn.Module, optimizer, sd: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, sd,
                             options=_opts(full_state_dict=True, broadcast_from_rank0=True))
