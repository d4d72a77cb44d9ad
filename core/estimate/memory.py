"""Peak GPU memory per rank for one training step, as PyTorch's caching allocator reserves it.

The model is what HF Trainer / ms-swift / the built-in trainer actually keep alive, tensor by
tensor, not a rule of thumb:

* weights in their load dtype (bf16 for LoRA/QLoRA bases and HF/ms-swift full fine-tuning;
  the built-in trainer keeps fp32 master weights for full fine-tuning), LoRA adapters in fp32
  (peft upcasts them), AdamW states in the trainable params' dtype (two per param);
* saved activations per decoder layer and token: RMSNorm keeps an fp32 copy of its input,
  q/k/v after RoPE and the attention output for SDPA, the gated MLP's gate/up/SiLU outputs,
  and every LoRA module keeps its *own* copy of its input (peft casts it to the adapter dtype,
  autocast casts it back to bf16, and that copy is what lora_A saves), plus a 1-byte mask per
  input element when lora_dropout > 0;
* the loss (HF's loss from labels): bf16 logits, their fp32 upcast and log-softmax; the bf16
  logits and the upcast are dropped before backward, whose peak holds the log-softmax output,
  its gradient and the upcast's gradient: 12 live bytes per logit, in four cached blocks that
  take 14 (the bf16 logits' block sits free at that moment) — gigabytes for a 150k vocab;
* with gradient checkpointing each layer keeps only its input; the one-layer recompute in
  backward happens after the loss's tensors are freed, so the larger of the two is the peak;
* the optimizer step: sharded (or whole) params, grads and AdamW states, plus foreach AdamW's
  sqrt(v) temporary of the size of one state (the fused kernel has none);
* the allocator: blocks freed stay reserved. The loss's large blocks are reserved on top of
  everything else (nothing else fits them while they are in use, and other tensors cut them up
  between steps), the rest gets ~5 % slack, and weights first materialized in a wider dtype and
  then cast (or sharded) leave the full-size blocks cached (`materialize_bytes`).

Calibrated on H200 (docs/benchmarks.md, tests/data/memory_calibration_h200.json): nine
configurations 0.5B-7B, LoRA/full, checkpointing on/off, DDP/FSDP2, within 10 % of
max_memory_reserved; Qwen2.5-7B LoRA r8 batch 4 × 2048: plain loop with autocast 83.7 GiB,
ms-swift (dropout 0.05) 92.8 GiB.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tunedeck.core.estimate.arch import ModelArch
from tunedeck.core.estimate.speed import FP8_GAIN

GIB = 2**30
# Caching-allocator slack over the allocated peak, measured on H200 (4.0-5.2 GiB on 80-105);
# with expandable segments (the built-in trainer) 0.2-0.4 GiB on 55-109 GiB.
FRAGMENTATION = 0.05
FRAGMENTATION_EXPANDABLE = 0.005
# The built-in trainer's chunked cross-entropy keeps, per logit of one chunk, the fp32
# log-softmax and the bf16 softmax-gradient alive together; compiled (core/train/ce_kernel.py)
# only the bf16 logits and the bf16 gradient (H200, 7B preset's chunk of 415 M logits: 1.55 GiB
# above its inputs compiled, 3.87 eager, bench/ce_chunk.py).
CHUNK_LIVE_BYTES = 6
CHUNK_LIVE_BYTES_COMPILED = 4
# Saved activations of compiled decoder layers vs eager (Inductor recomputes cheap pointwise
# results instead of saving them): 7B LoRA r8, batch 4 × 2048 on H200, built-in trainer,
# 62.2 GiB allocated compiled vs 69.8 eager, weights and loss chunk alike.
COMPILED_ACT_FACTOR = 0.85
# The loss over materialized logits, bytes per logit (see the module docstring).
LOSS_LIVE_BYTES = 12  # log-softmax output + its grad + the upcast's grad (all fp32)
CUDA_CONTEXT_GIB = 0.75  # CUDA context + kernels; not in torch's reserved count
NCCL_BUFFERS_GIB = 0.75  # per-peer NCCL channels when world > 1
DS_BUCKETS_ELEMS = 2e8  # DeepSpeed allgather/reduce buckets (ms-swift's zero configs)


@dataclass
class MemoryInputs:
    arch: ModelArch
    method: str = "lora"  # full | lora | qlora
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("all-linear",)
    lora_dropout: float = 0.0
    quant_bits: int = 4
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    strategy: str = "ddp"  # ddp | fsdp2 | deepspeed | megatron
    zero_stage: int = 0
    offload: str = "none"  # none | optimizer | all (fsdp2 cpu_offload = all)
    world_size: int = 1
    tp: int = 1
    pp: int = 1
    gradient_checkpointing: bool = False
    compute_bytes: int = 2  # 2 = bf16/fp16 compute, 4 = fp32 (CPU)
    autocast: bool = True  # forward under torch.autocast (HF bf16=True)
    master_fp32: bool = False  # full FT keeps fp32 weights (built-in trainer)
    fused_optimizer: bool = False  # fused AdamW (built-in trainer): no foreach temporary
    materialize_bytes: int = 0  # weights first built at this width on the GPU, then
    # cast/sharded (0 = loaded in their training dtype)
    attn_impl: str = "sdpa"
    device: str = "cuda"
    # the built-in trainer: cross-entropy over head chunks of at most this many logits (0 = the
    # whole batch's logits materialized, as HF/ms-swift compute the loss), decoder layers
    # compiled, and expandable allocator segments (reserved ≈ allocated)
    loss_chunk_elems: int = 0
    compiled: bool = False
    fused_lora: bool = False  # LoRA linears fused where DDP runs them
    # (core/train/lora_fused.py, the CUDA default)
    expandable_segments: bool = False
    # the built-in trainer wraps DDP at any world size with gradient_as_bucket_view: the
    # gradients are views of DDP's buckets, allocated once (its first forward) and kept for
    # the whole run, so they are live in the forward too, not only from the backward on
    grads_in_buckets: bool = False
    fp8_base: bool = False  # method.fp8_base: the frozen products in e4m3 (same bytes as bf16)

    def to_json(self) -> dict:
        d = asdict(self)
        d["arch"] = self.arch.to_json()
        d["lora_targets"] = list(self.lora_targets)
        return d


@dataclass
class MemoryEstimate:
    breakdown: dict[str, float]  # GiB at the peak phase; sums to per_gpu_gib
    allocated_gib: float  # torch.cuda.max_memory_allocated
    reserved_gib: float  # torch.cuda.max_memory_reserved
    per_gpu_gib: float  # what the device shows (reserved + context + NCCL)
    peak_phase: str
    params: int
    trainable_params: int
    tokens_per_micro_step: int
    checkpoint_bytes: int  # one saved checkpoint (trainable weights + optimizer)
    host_load_bytes: int  # host RAM one process needs to load the weights
    cpu_offload_bytes: int  # host RAM per rank held by offloaded states
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()
        } | {"breakdown": {k: round(v, 2) for k, v in self.breakdown.items()}}


# which input each adaptable linear of a decoder layer reads
_SHARED_INPUT = {
    "q_proj": "x1",
    "k_proj": "x1",
    "v_proj": "x1",
    "gate_proj": "x2",
    "up_proj": "x2",
    "o_proj": "o",
    "down_proj": "d",
}


def _lean_compiled(m: MemoryInputs) -> bool:
    """The built-in trainer's compiled, fused LoRA layers (16-bit or 4-bit base), whose
    partitioner recomputes what backward can rebuild from the residuals and the MLP's gate and
    up (fastpath.lean_saves)."""
    return (
        m.compiled
        and m.fused_lora
        and m.method in ("lora", "qlora")
        and m.strategy == "ddp"
        and m.compute_bytes != 4
        and m.attn_impl != "eager"
    )


def _activation_bytes_per_token_layer(m: MemoryInputs) -> float:
    """Bytes one decoder layer keeps for backward per token (no checkpointing)."""
    a = m.compute_bytes
    ar = m.arch
    lora = ar.lora_modules(m.lora_targets) if m.method in ("lora", "qlora") else []
    shapes = ar.linear_shapes()
    if _lean_compiled(m):
        # counted with saved-tensor hooks on a compiled layer (tests/test_estimate_builtin.py):
        # the two residuals and their fp32 rsqrt, SDPA's q, k, v, output and fp32 logsumexp,
        # gate and up; the normalized inputs and SiLU(gate)·up are recomputed in backward
        return float(
            2 * a * ar.hidden
            + 2 * 4
            + a * (2 * ar.q_dim + 2 * ar.kv_dim)
            + 4 * ar.heads
            + 2 * a * ar.intermediate
            + a * m.lora_rank * len(lora)
        )
    h, i, q, kv = ar.hidden, ar.intermediate, ar.q_dim, ar.kv_dim
    full = m.method == "full"
    n = 2 * 4 * h  # two RMSNorms save an fp32 copy of their input
    n += a * (q + 2 * kv) + a * q  # RoPE'd q, k, v and the attention output (SDPA)
    if m.attn_impl == "eager":  # softmax probs and their dropout input, per head
        n += 2 * a * ar.heads * m.seq_len
    n += 3 * a * i  # gate, up and SiLU(gate) outputs
    if full:
        # trainable norm weights keep the normalized input; linears keep their inputs
        n += 2 * a * h + a * h * 2 + a * q + a * i
        if m.master_fp32 and m.strategy == "ddp" and a < 4:
            # fp32 weights outside the matmuls (embedding, norms) keep the residual stream
            # fp32 under autocast: the layer's input, the residual after attention and both
            # normalized inputs are saved in fp32. +10 h bytes a token over bf16 weights,
            # counted tensor by tensor with saved-tensor hooks (tests/test_estimate_builtin.py).
            # FSDP2 computes with bf16 copies of the masters (MixedPrecisionPolicy): no change.
            n += 10 * h
    if lora:
        # the distinct inputs of the adapted linears (q/k/v share one, gate/up another)
        inputs = {"x1": h, "x2": h, "o": q, "d": i}
        distinct = sum(inputs[s] for s in {_SHARED_INPUT[mod] for mod in lora})
        if a == 4 and not full:
            # fp32 compute: peft's cast is a no-op, lora_A saves the shared inputs themselves
            n += 4 * distinct
        if m.fused_lora and m.strategy == "ddp" and a != 4:
            # the fused layer saves its input as it comes, one copy per shared input, where
            # peft's casts make one per module (counted with saved-tensor hooks:
            # tests/test_estimate_builtin.py); with dropout they keep no mask, backward
            # draws it again (lora_dropout.py)
            return float(n + a * distinct + a * m.lora_rank * len(lora))
        for mod in lora:
            d_in = shapes[mod][0]
            if a != 4:
                # peft casts the input to fp32; autocast casts it back: a new copy per module
                n += (2 if m.autocast else 4) * d_in
            if m.lora_dropout > 0:
                n += d_in * (1 + (4 if a == 4 else 0))  # bool mask (+ fp32 dropout output)
            n += a * m.lora_rank  # lora_A output, saved by lora_B
    return float(n)


def estimate_memory(m: MemoryInputs) -> MemoryEstimate:
    ar = m.arch
    notes: list[str] = []
    N = ar.total_params()
    world = max(m.world_size, 1)
    tokens = m.micro_batch * m.seq_len
    a = m.compute_bytes
    full = m.method == "full"
    lora_n = ar.lora_params(m.lora_rank, m.lora_targets) if not full else 0
    trainable = N if full else lora_n

    # -- bytes per parameter -------------------------------------------------------------
    if full:
        w_bytes = 4 if (m.master_fp32 or a == 4) else 2
        base_bytes = N * w_bytes
        g_bytes, opt_bytes = w_bytes, 2 * w_bytes  # AdamW states in the params' dtype
        if m.strategy == "deepspeed":
            w_bytes, g_bytes = 2, 2
            base_bytes = N * 2
            opt_bytes = 16  # fp32 master + two moments + fp32 grad partition
        elif m.strategy == "fsdp2":
            # sharded fp32 masters, bf16 all-gathers (MixedPrecisionPolicy)
            w_bytes, g_bytes, opt_bytes = 4, 4, 8
            base_bytes = N * 4
    else:
        lin = ar.linear_params()
        if m.method == "qlora":
            qb = 0.5 + 0.02 if m.quant_bits == 4 else 1.0 + 0.01  # + quantization constants
            base_bytes = lin * qb + (N - lin) * 2
        else:
            base_bytes = N * (4 if a == 4 else 2)
        w_bytes, g_bytes, opt_bytes = 4, 4, 8  # peft keeps adapters in fp32
    train_w = trainable * w_bytes if not full else 0  # LoRA weights (full: in base)

    # -- sharding ------------------------------------------------------------------------
    weights = base_bytes
    grads = trainable * g_bytes
    optim = trainable * opt_bytes
    opt_temp = 0.0
    buckets = 0.0
    resident_grads = False
    working = 0.0  # unsharded params gathered for the current (+ prefetched) layer
    comm_pool = 0.0  # blocks reserved by the communication streams (FSDP2)
    layer_bytes = ar.layer_params() * 2
    edge_bytes = (ar.embedding_params() + ar.head_params()) * 2
    offload_host = 0.0
    s = m.strategy
    if s == "ddp":
        if full and m.master_fp32:
            working = N * 2  # autocast's bf16 copies of fp32 weights
        if m.grads_in_buckets:
            resident_grads = True  # the buckets are the gradients: no copy, never freed
        elif world > 1:
            buckets = grads  # DDP's gradient buckets are a copy
    elif s == "fsdp2":
        weights = base_bytes / world
        grads /= world
        optim /= world
        train_w /= world
        working = 2 * layer_bytes + edge_bytes + (layer_bytes if full else 0)
        # All-gathers and reduce-scatters run on their own CUDA streams, and the allocator
        # keeps a stream's freed blocks for that stream: the gathered root (embedding, head;
        # not resharded between forward and backward) and two layers, and, for full
        # fine-tuning, the fp32 reduce-scatter inputs of the root and one layer stay reserved.
        comm_pool = (
            edge_bytes
            + 2 * layer_bytes
            + ((ar.embedding_params() + ar.head_params() + ar.layer_params()) * 4 if full else 0)
        )
        if m.offload != "none":
            offload_host = weights + grads + optim + train_w
            weights = grads = optim = train_w = 0.0
            notes.append(
                "FSDP2 CPU offload: sharded params, grads and optimizer live in host "
                "RAM; each step copies them in and out (slower)"
            )
    elif s == "deepspeed":
        z = m.zero_stage
        buckets = DS_BUCKETS_ELEMS * 2 * 2 if world > 1 or z > 0 else 0.0
        if z >= 1:
            optim /= world
        if z >= 2:
            grads /= world
        if z >= 3:
            weights = base_bytes / world
            train_w /= world
            working = 2 * max(layer_bytes, edge_bytes)
        if m.offload in ("optimizer", "all") and z >= 1:
            offload_host += optim + (grads if z >= 2 else 0)
            optim = 0.0
            if z >= 2:
                grads = 0.0
        if m.offload == "all":
            if z >= 3:
                offload_host += weights
                weights = 0.0
            else:
                notes.append(
                    "zero_offload = all offloads parameters only with ZeRO-3; "
                    "stage < 3 offloads the optimizer"
                )
    elif s == "megatron":
        shard = max(m.tp * m.pp, 1)
        weights /= shard
        grads /= shard
        dp = max(world // shard, 1)
        optim /= shard * dp  # distributed optimizer over data parallel
        notes.append("Megatron: approximated as weights/(tp·pp), activations/tp")
    if m.device == "cuda" and not m.fused_optimizer and s in ("ddp", "fsdp2") and optim:
        opt_temp = optim / 2  # foreach AdamW's sqrt(v): one state's size, on this rank

    if m.fp8_base:
        notes.append(
            f"frozen base in fp8 (e4m3, per-row scales): ~{FP8_GAIN:.1f}x tokens/s, same memory; "
            "its LoRA gradients come out ~6-14 % off against bf16's ~1 % on outlier-heavy "
            "activations (docs/benchmarks.md, the fp8 study)"
        )

    # -- activations and the loss ---------------------------------------------------------
    per_layer = _activation_bytes_per_token_layer(m) * tokens
    layers = ar.layers / max(m.pp, 1)
    layer_temp = 3 * a * ar.intermediate * tokens  # a layer's backward temporaries (MLP grads)
    if m.gradient_checkpointing:
        # each layer keeps only its input; one layer at a time is recomputed in backward
        acts = layers * a * ar.hidden * tokens
        transient = per_layer + layer_temp
    else:
        acts = layers * per_layer
        transient = layer_temp
    if m.compiled and not _lean_compiled(m):
        acts *= COMPILED_ACT_FACTOR
    # compiled QLoRA through peft's 4-bit layers also keeps five of a layer's linears' own
    # outputs (q, one of k/v, o, one of gate/up, down: bitsandbytes' F.linear results, beside
    # peft's copies) until backward: 12.85 GiB in 139 blocks at a 7B step's peak (allocator
    # trace, docs/benchmarks.md). Measured compiled without checkpointing; counted only there.
    # The fused 4-bit layer (core/train/qlora_fused.py, where DDP runs it) keeps none of them.
    fused = m.fused_lora and m.strategy == "ddp"
    qlora_outs = m.method == "qlora" and m.compiled and not m.gradient_checkpointing and not fused
    if qlora_outs:
        acts += layers * tokens * a * (ar.q_dim + ar.kv_dim + 2 * ar.hidden + ar.intermediate)
    acts += 4 * ar.hidden * tokens + (a * ar.hidden * tokens if full else 0)  # final norm, head
    if s == "megatron":
        acts /= max(m.tp, 1)
        transient /= max(m.tp, 1)
    has_loss = m.pp <= 1 or s != "megatron"
    n_logits = tokens * ar.vocab if has_loss else 0
    loss_live = n_logits * LOSS_LIVE_BYTES
    loss_blocks = n_logits * (LOSS_LIVE_BYTES + (a if a < 4 else 0))
    if m.loss_chunk_elems and n_logits:
        # balanced chunks (core/train/parallel.rows_per_chunk), one alive at a time
        pieces = -(-n_logits // m.loss_chunk_elems)
        chunk = -(-tokens // pieces) * ar.vocab
        per = CHUNK_LIVE_BYTES_COMPILED if m.compiled else CHUNK_LIVE_BYTES
        loss_live = loss_blocks = chunk * per
    # The layers' backward comes after the loss's tensors are freed: the larger one is the peak,
    # and it fits in the loss's cached blocks when those are the larger.
    logits = max(loss_live, transient)
    head_grad = ar.vocab * ar.hidden * g_bytes if full and s == "ddp" else 0.0

    # -- peak over the two phases of a step --------------------------------------------------
    resident = weights + train_w + optim + buckets
    accum_grads = grads if m.grad_accum > 1 or resident_grads else 0.0
    fwd_base = resident + working + acts + accum_grads + head_grad
    fwd = fwd_base + logits
    # FSDP2 has resharded everything by the optimizer step
    bwd = resident + (working if s != "fsdp2" else 0.0) + grads + opt_temp
    # Reserved: the loss's blocks come on top of everything else (see the docstring); what was
    # cached while the weights were built counts when it is more than the step itself uses.
    built = ar.total_params() * m.materialize_bytes if m.device == "cuda" else 0.0
    big = max(loss_blocks, transient)
    # The optimizer step's grads and temporaries reuse the loss's blocks; blocks of the
    # communication streams serve only them.
    on_streams = working if s == "fsdp2" else 0.0
    frag = FRAGMENTATION_EXPANDABLE if m.expandable_segments else FRAGMENTATION
    fwd_res = max(fwd_base - on_streams, built) * (1 + frag) + max(comm_pool, on_streams) + big
    bwd_res = max(bwd, built) * (1 + frag) + comm_pool
    if fwd >= bwd:
        phase = "forward end / loss backward"
        g_shown, act_shown, logit_shown = accum_grads + head_grad, acts, logits
        if transient > loss_live:  # a recomputed/backward layer, not the loss, peaks
            act_shown, logit_shown = acts + transient, 0.0
        opt_shown = optim
    else:
        phase = "backward end / optimizer step"
        g_shown, act_shown, logit_shown = grads, 0.0, 0.0
        opt_shown = optim + opt_temp
    allocated = max(fwd, bwd)
    reserved = max(fwd_res, bwd_res, allocated)
    w_shown = working if (fwd >= bwd or s != "fsdp2") else 0.0
    outside = 0.0
    if m.device == "cuda":
        outside = CUDA_CONTEXT_GIB * GIB + (NCCL_BUFFERS_GIB * GIB if world > 1 else 0.0)
    breakdown = {
        "weights": (weights + w_shown + (buckets if s != "ddp" else 0)) / GIB,
        "trainable_weights": train_w / GIB,
        "gradients": (g_shown + (buckets if s == "ddp" else 0)) / GIB,
        "optimizer_states": opt_shown / GIB,
        "activations": act_shown / GIB,
        "logits": logit_shown / GIB,
        # allocator cache (the loss's blocks, slack, build leftovers) + CUDA context + NCCL
        "framework_overhead": (reserved - allocated + outside) / GIB,
    }
    if m.method == "qlora":
        notes.append(
            "QLoRA: frozen linears in 4/8-bit with bitsandbytes, dequantized one layer at a "
            "time"
            + (
                "; compiled, the 4-bit linears' outputs are kept until backward too "
                "(gradient checkpointing keeps one layer's)"
                if qlora_outs
                else ""
            )
        )
    if loss_blocks > 0.15 * reserved and loss_blocks > GIB and not m.loss_chunk_elems:
        notes.append(
            f"the loss over a {ar.vocab}-token vocabulary reserves "
            f"{loss_blocks / GIB:.1f} GiB (fp32 logits); a smaller micro-batch or a "
            "chunked/fused cross-entropy cuts it"
        )
    ckpt = trainable * (4 if not full else w_bytes) + trainable * (
        opt_bytes if s != "deepspeed" else 12
    )
    host_load = int(base_bytes if not full else N * (4 if m.master_fp32 else 2))
    return MemoryEstimate(
        breakdown=breakdown,
        allocated_gib=allocated / GIB,
        reserved_gib=reserved / GIB,
        per_gpu_gib=(reserved + outside) / GIB,
        peak_phase=phase,
        params=N,
        trainable_params=trainable,
        tokens_per_micro_step=tokens,
        checkpoint_bytes=int(ckpt),
        host_load_bytes=host_load,
        cpu_offload_bytes=int(offload_host),
        notes=notes,
    )
