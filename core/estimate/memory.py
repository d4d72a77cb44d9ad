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
* the loss: bf16 logits, their fp32 upcast and log-softmax, and in backward two more fp32
  tensors of tokens × vocab (14 bytes per logit at the peak) — gigabytes for a 150k vocab;
* caching-allocator slack (~5 % of the peak) and, outside PyTorch's count, the CUDA context and
  NCCL buffers.

Calibrated on H200 (docs/benchmarks.md): Qwen2.5-7B, LoRA r8 all-linear, batch 4 × 2048, no
checkpointing: plain loop with autocast 83.7 GiB reserved, + lora_dropout 0.05 93.5 GiB,
ms-swift 92.8 GiB; the dropout and autocast deltas match the per-module terms above to <0.5 GiB.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from core.estimate.arch import ModelArch

GIB = 2**30
# Caching-allocator slack over the allocated peak, measured on H200 (4.0-5.2 GiB on 80-105).
FRAGMENTATION = 0.05
CUDA_CONTEXT_GIB = 0.75      # CUDA context + kernels; not in torch's reserved count
NCCL_BUFFERS_GIB = 0.75      # per-peer NCCL channels when world > 1
DS_BUCKETS_ELEMS = 2e8       # DeepSpeed allgather/reduce buckets (ms-swift's zero configs)


@dataclass
class MemoryInputs:
    arch: ModelArch
    method: str = "lora"                 # full | lora | qlora
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("all-linear",)
    lora_dropout: float = 0.0
    quant_bits: int = 4
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    strategy: str = "ddp"                # ddp | fsdp2 | deepspeed | megatron
    zero_stage: int = 0
    offload: str = "none"                # none | optimizer | all (fsdp2 cpu_offload = all)
    world_size: int = 1
    tp: int = 1
    pp: int = 1
    gradient_checkpointing: bool = False
    compute_bytes: int = 2               # 2 = bf16/fp16 compute, 4 = fp32 (CPU)
    autocast: bool = True                # forward under torch.autocast (HF bf16=True)
    master_fp32: bool = False            # full FT keeps fp32 weights (built-in trainer)
    attn_impl: str = "sdpa"
    device: str = "cuda"

    def to_json(self) -> dict:
        d = asdict(self)
        d["arch"] = self.arch.to_json()
        d["lora_targets"] = list(self.lora_targets)
        return d


@dataclass
class MemoryEstimate:
    breakdown: dict[str, float]          # GiB at the peak phase; sums to per_gpu_gib
    allocated_gib: float                 # torch.cuda.max_memory_allocated
    reserved_gib: float                  # torch.cuda.max_memory_reserved
    per_gpu_gib: float                   # what the device shows (reserved + context + NCCL)
    peak_phase: str
    params: int
    trainable_params: int
    tokens_per_micro_step: int
    checkpoint_bytes: int                # one saved checkpoint (trainable weights + optimizer)
    host_load_bytes: int                 # host RAM one process needs to load the weights
    cpu_offload_bytes: int               # host RAM per rank held by offloaded states
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in asdict(self).items()} | {
            "breakdown": {k: round(v, 2) for k, v in self.breakdown.items()}}


def _activation_bytes_per_token_layer(m: MemoryInputs) -> float:
    """Bytes one decoder layer keeps for backward per token (no checkpointing)."""
    a = m.compute_bytes
    ar = m.arch
    h, i, q, kv = ar.hidden, ar.intermediate, ar.q_dim, ar.kv_dim
    full = m.method == "full"
    n = 2 * 4 * h                            # two RMSNorms save an fp32 copy of their input
    n += a * (q + 2 * kv) + a * q            # RoPE'd q, k, v and the attention output (SDPA)
    if m.attn_impl == "eager":               # softmax probs and their dropout input, per head
        n += 2 * a * ar.heads * m.seq_len
    n += 3 * a * i                           # gate, up and SiLU(gate) outputs
    if full:
        # trainable norm weights keep the normalized input; linears keep their inputs
        n += 2 * a * h + a * h * 2 + a * q + a * i
    lora = ar.lora_modules(m.lora_targets) if m.method in ("lora", "qlora") else []
    shapes = ar.linear_shapes()
    if lora:
        if a == 4 and not full:
            # fp32 compute: peft's cast is a no-op, lora_A saves the shared inputs themselves
            shared = {"q_proj": "x1", "k_proj": "x1", "v_proj": "x1", "gate_proj": "x2",
                      "up_proj": "x2", "o_proj": "o", "down_proj": "d"}
            seen = {shared[mod] for mod in lora}
            n += 4 * sum({"x1": h, "x2": h, "o": q, "d": i}[s] for s in seen)
        for mod in lora:
            d_in = shapes[mod][0]
            if a != 4:
                # peft casts the input to fp32; autocast casts it back: a new copy per module
                n += (2 if m.autocast else 4) * d_in
            if m.lora_dropout > 0:
                n += d_in * (1 + (4 if a == 4 else 0))   # bool mask (+ fp32 dropout output)
            n += a * m.lora_rank                         # lora_A output, saved by lora_B
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
        g_bytes, opt_bytes = w_bytes, 2 * w_bytes          # AdamW states in the params' dtype
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
            qb = 0.5 + 0.02 if m.quant_bits == 4 else 1.0 + 0.01   # + quantization constants
            base_bytes = lin * qb + (N - lin) * 2
        else:
            base_bytes = N * (4 if a == 4 else 2)
        w_bytes, g_bytes, opt_bytes = 4, 4, 8                # peft keeps adapters in fp32
    train_w = trainable * w_bytes if not full else 0          # LoRA weights (full: in base)

    # -- sharding ------------------------------------------------------------------------
    weights = base_bytes
    grads = trainable * g_bytes
    optim = trainable * opt_bytes
    opt_temp = 0.0
    buckets = 0.0
    working = 0.0       # unsharded params gathered for the current (+ prefetched) layer
    layer_bytes = ar.layer_params() * 2
    edge_bytes = (ar.embedding_params() + ar.head_params()) * 2
    offload_host = 0.0
    s = m.strategy
    if s == "ddp":
        if full and not m.master_fp32 and m.device == "cuda":
            opt_temp = trainable * (opt_bytes / 2)  # foreach AdamW's sqrt(v) temporary
        if full and m.master_fp32:
            working = N * 2                         # autocast's bf16 copies of fp32 weights
        if world > 1:
            buckets = grads                         # DDP's gradient buckets are a copy
    elif s == "fsdp2":
        weights = base_bytes / world
        grads /= world
        optim /= world
        train_w /= world
        working = 2 * layer_bytes + edge_bytes + (layer_bytes if full else 0)
        if m.offload != "none":
            offload_host = weights + grads + optim + train_w
            weights = grads = optim = train_w = 0.0
            notes.append("FSDP2 CPU offload: sharded params, grads and optimizer live in host "
                         "RAM; each step copies them in and out (slower)")
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
                notes.append("zero_offload = all offloads parameters only with ZeRO-3; "
                             "stage < 3 offloads the optimizer")
    elif s == "megatron":
        shard = max(m.tp * m.pp, 1)
        weights /= shard
        grads /= shard
        dp = max(world // shard, 1)
        optim /= shard * dp                         # distributed optimizer over data parallel
        notes.append("Megatron: approximated as weights/(tp·pp), activations/tp")

    # -- activations and logits ------------------------------------------------------------
    per_layer = _activation_bytes_per_token_layer(m) * tokens
    layers = ar.layers / max(m.pp, 1)
    if m.gradient_checkpointing:
        # each layer keeps only its input; one layer is recomputed at a time in backward
        acts = layers * a * ar.hidden * tokens + per_layer
    else:
        acts = layers * per_layer
    acts += 4 * ar.hidden * tokens + (a * ar.hidden * tokens if full else 0)  # final norm, head
    if s == "megatron":
        acts /= max(m.tp, 1)
    logits = tokens * ar.vocab * (a + 12) if m.pp <= 1 or s != "megatron" else 0.0
    # A layer's backward temporaries come after the loss's tensors are freed: the larger wins.
    logits = max(logits, 3 * a * ar.intermediate * tokens)
    head_grad = ar.vocab * ar.hidden * g_bytes if full and s == "ddp" else 0.0

    # -- peak over the two phases of a step --------------------------------------------------
    resident = weights + train_w + optim + buckets
    accum_grads = grads if m.grad_accum > 1 else 0.0
    fwd = resident + working + acts + logits + accum_grads + head_grad
    bwd = resident + working + grads + opt_temp
    if fwd >= bwd:
        phase = "forward end / loss backward"
        g_shown, act_shown, logit_shown = accum_grads + head_grad, acts, logits
        opt_shown = optim
    else:
        phase = "backward end / optimizer step"
        g_shown, act_shown, logit_shown = grads, 0.0, 0.0
        opt_shown = optim + opt_temp
    allocated = max(fwd, bwd)
    reserved = allocated * (1 + FRAGMENTATION)
    outside = 0.0
    if m.device == "cuda":
        outside = CUDA_CONTEXT_GIB * GIB + (NCCL_BUFFERS_GIB * GIB if world > 1 else 0.0)
    breakdown = {
        "weights": (weights + working + (buckets if s != "ddp" else 0)) / GIB,
        "trainable_weights": train_w / GIB,
        "gradients": (g_shown + (buckets if s == "ddp" else 0)) / GIB,
        "optimizer_states": opt_shown / GIB,
        "activations": act_shown / GIB,
        "logits": logit_shown / GIB,
        "framework_overhead": (reserved - allocated + outside) / GIB,
    }
    if m.method == "qlora":
        notes.append("QLoRA: frozen linears in 4/8-bit with bitsandbytes; dequantized one "
                     "layer at a time")
    if logits > 0.15 * allocated and logits > GIB:
        notes.append(f"the loss over a {ar.vocab}-token vocabulary holds "
                     f"{logits / GIB:.1f} GiB (fp32 logits); a smaller micro-batch or a "
                     "chunked/fused cross-entropy cuts it")
    ckpt = trainable * (4 if not full else w_bytes) + trainable * (opt_bytes if s != "deepspeed"
                                                                   else 12)
    host_load = int(base_bytes if not full else N * (4 if m.master_fp32 else 2))
    return MemoryEstimate(
        breakdown=breakdown, allocated_gib=allocated / GIB, reserved_gib=reserved / GIB,
        per_gpu_gib=(reserved + outside) / GIB, peak_phase=phase, params=N,
        trainable_params=trainable, tokens_per_micro_step=tokens, checkpoint_bytes=int(ckpt),
        host_load_bytes=host_load, cpu_offload_bytes=int(offload_host), notes=notes)
