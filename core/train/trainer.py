"""The built-in trainer: causal-LM fine-tuning (full, LoRA, QLoRA) under DDP or FSDP2.

Per optimizer step: fetch grad_accum micro-batches (timing the waits), forward/backward each
(gradient sync only on the last), clip, step, then ONE all-reduce of
[loss sum, label tokens, stop flag, grad norm]. That collective gives every rank the global
loss and the same stop decision, so all ranks stop after the same step. It is also the step's
only host sync (reading it back for the event); nothing else in the loop waits on the GPU.

Resume restores model/adapter, optimizer, scheduler, every rank's RNG and the data position
(epoch + batches taken in it), so the continued run sees exactly the batches the uninterrupted
one would have. It happens with train.resume_from (a folder, or "auto" = newest complete
checkpoint), and automatically on an agent or torchrun restart (TUNEDECK_ATTEMPT > 0,
TORCHELASTIC_RESTART_COUNT > 0).
"""

from __future__ import annotations

import logging
import os
import faulthandler
import re
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable, Iterator

import psutil
import torch
import torch.distributed as dist

from tunedeck.core.spec import RunSpec, load_spec
from tunedeck.core.train import ce_kernel
from tunedeck.core.train import checkpoint as ckpt
from tunedeck.core.train.data import (
    Batches,
    load_datasets,
    make_loader,
    PackedDataset,
    TokenizeProgress,
)
from tunedeck.core.train.fastpath import (
    LayerCompiler,
    check_varlen,
    compile_wanted,
    is_compile_error,
    length_buckets,
    use_packed_attention,
)
from tunedeck.core.probe import flight
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.rundir.events import EventWriter
from tunedeck.core.estimate.speed import peak_tflops
from tunedeck.core.train.flops import mfu, step_flops
from tunedeck.core.train import lora_triton
from tunedeck.core.train.lora_fused import base_numel, fp8_problem, fuse_lora
from tunedeck.core.train.model import (
    build_model,
    compute_dtype,
    count_params,
    keep_out_bitsandbytes,
    load_tokenizer,
    resolve_model_path,
)
from tunedeck.core.train.parallel import (
    CausalLMLoss,
    IGNORE,
    base_causal_lm,
    clip_grad_norm,
    decoder_layers,
    full_model_state,
    full_optimizer_state,
    grad_sync,
    load_model_state,
    load_optimizer_state,
    wrap,
)

GIB = 2**30
# Only tests and fault benchmarks set variables with this prefix; they load core/train/faults.py.
FAULTS_ENV_PREFIX = "TUNEDECK_TEST_"


def all_reduce_result(stats: torch.Tensor) -> list[float]:
    """The values of an all-reduced tensor. A function of its own so that a stack dump of a
    rank waiting here for a hung peer names the collective (on a GPU the all-reduce itself
    returns at once; the wait is in this copy to the host)."""
    return stats.tolist()


class ForwardTimer:
    """Forward-pass time of this rank in a step: the compute proxy straggler detection needs.

    step_s cannot show a slow rank under DDP, because the fast ranks wait for it inside the
    backward's all-reduce; the forward has no collective (under DDP) so its time is this rank's
    own. On CUDA it uses events read after the step's one host sync, adding no sync itself.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []
        self.cpu_s = 0.0
        self._t = 0.0

    def start(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.spans.append([ev, None])
        else:
            self._t = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.spans[-1][1] = ev
        else:
            self.cpu_s += time.perf_counter() - self._t

    def total(self) -> float:
        """Seconds; call after the step's host sync so CUDA events have completed."""
        if self.cuda:
            return sum(a.elapsed_time(b) for a, b in self.spans if b is not None) / 1000.0
        return self.cpu_s


class StopFlag:
    """SIGTERM/SIGINT ask for a graceful stop; the loop acts on it at the end of a step.

    A second SIGINT (Ctrl-C twice at a terminal) kills at once. Repeated SIGTERMs do not:
    the supervisor's hard stop is SIGKILL after a grace period.
    """

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.requested and signum == signal.SIGINT:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = True


@dataclass
class TrainState:
    """What a resume needs besides model/optimizer/scheduler state."""

    step: int = 0
    loss: float | None = None
    resumed_from: str | None = None


@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def stop_agreed(stop: StopFlag, stop_file: Path, device: torch.device) -> bool:
    """Has any rank been asked to stop (a SIGTERM, or the run's stop.json)? One all-reduce,
    so every rank gets the same answer and they all leave together."""
    flag = stop.requested or stop_file.exists()
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def attempt() -> int:
    """>0 when this process is a restart (by the tunedeck agent or by torchrun itself)."""

    def num(name: str) -> int:
        try:
            return int(os.environ.get(name, "0") or 0)
        except ValueError:
            return 0

    return max(num("TUNEDECK_ATTEMPT"), num("TORCHELASTIC_RESTART_COUNT"))


def init_distributed(spec: RunSpec) -> Dist:
    try:
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
    except KeyError as e:
        raise SystemExit(
            f"tunedeck.core.train: {e.args[0]} is not set; start me with torchrun "
            f"(python -m torch.distributed.run ... -m tunedeck.core.train --run-dir DIR)"
        )
    want = spec.cluster.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("cluster.device is cuda but torch sees no GPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = spec.cluster.dist_backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    # a finite collective timeout turns a hung rank into a failed run instead of idle GPUs
    timeout = spec.cluster.collective_timeout_s
    dist.init_process_group(
        backend=backend,
        device_id=device if device.type == "cuda" else None,
        timeout=timedelta(seconds=timeout) if timeout else None,
    )
    return Dist(rank, local_rank, world, device)


def _peft_key(name: str) -> str:
    """Parameter name in the training module → key in peft's adapter_model.safetensors."""
    return re.sub(r"\.default(?=\.|$)", "", name.removeprefix("model."))


def _bcast(obj, src_rank: int = 0):
    box = [obj]
    dist.broadcast_object_list(box, src=src_rank)
    return box[0]


def forward_inputs(
    b: dict[str, torch.Tensor], dev: torch.device, packed_max: int = 0
) -> dict[str, torch.Tensor]:
    """The loss module's inputs for one (CPU, pinned) batch, on `dev`. What the batch lets the
    model skip is decided here, on the CPU copy, so the GPU is never asked (no sync).

    packed_max > 0: packed rows go to the trainer's packed attention, which reads the
    documents' boundaries (cu_seqlens) and this bound on a document's length."""
    kw = {
        k: b[k].to(dev, non_blocking=True)
        for k in ("input_ids", "targets", "position_ids")
        if k in b
    }
    if packed_max and "cu_seqlens" in b:
        cu = b["cu_seqlens"].to(dev, non_blocking=True)
        kw.update(
            cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=packed_max, max_length_k=packed_max
        )
    mask = b.get("attention_mask")
    # All ones (nothing padded): no mask at all, so attention runs the plain causal kernel and
    # transformers does not inspect the mask on the GPU.
    if mask is not None and not bool(mask.all()):
        kw["attention_mask"] = mask.to(dev, non_blocking=True)
    labelled = b["targets"].flatten() != IGNORE
    if not bool(labelled.all()):
        # The output head and loss run only on labelled positions: prompts and padding are
        # skipped (on chat data most of the vocabulary-wide work).
        pos = labelled.nonzero().squeeze(1)
        if dev.type == "cuda":
            pos = pos.pin_memory()  # an asynchronous copy needs page-locked memory
        kw["label_pos"] = pos.to(dev, non_blocking=True)
    return kw


def _shape_key(b: dict[str, torch.Tensor]) -> tuple:
    """What a compiled layer specialises on: the batch's shape and whether a mask comes."""
    mask = b.get("attention_mask")
    return (*b["input_ids"].shape, mask is not None and not bool(mask.all()))


@contextmanager
def _sdpa_priority():
    """TUNEDECK_SDPA=cudnn (a benchmark switch): SDPA tries cuDNN's attention first."""
    if os.environ.get("TUNEDECK_SDPA") != "cudnn":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
    with sdpa_kernel(order, set_priority=True):
        yield


class Trainer:
    def __init__(
        self,
        spec: RunSpec,
        run_dir: Path,
        d: Dist,
        events: EventWriter,
        stop: StopFlag,
        model_path: tuple[Path, bool] | None = None,
        *,
        model=None,
        tokenizer=None,
        datasets=None,
    ):
        """model/tokenizer/datasets: given by the benchmark (a model built from a config,
        synthetic data); otherwise loaded from the spec."""
        from transformers import get_scheduler, set_seed
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # bars fill rank logs with carriage returns
        self.spec, self.d, self.events, self.stop = spec, d, events, stop
        self.model_path = model_path
        self.output_dir = RunDir(run_dir).output_dir(spec)
        self.stop_file = RunDir(run_dir).stop_request  # a stop asked before the first step
        self.state = TrainState()
        self.save_at_end = True  # the benchmark turns it off (a 7B full checkpoint is ~90 GB)
        tr = spec.train
        set_seed(tr.seed)  # same LoRA init and dropout stream on every rank

        self.dtype = compute_dtype(spec.model.dtype, d.device)
        if model is None:
            path, builtin = model_path
            self.tokenizer = load_tokenizer(path, builtin)
            model, self.method = build_model(spec, path, d.device, self.dtype)
        else:
            self.tokenizer, self.method = tokenizer, spec.method.type
        self.model = model
        fused = 0
        if self.method in ("lora", "qlora") and spec.parallel.strategy == "ddp":
            fp8 = spec.method.fp8_base and self.method == "lora"
            why = fp8_problem(d.device, self.dtype) if fp8 else None
            if why:
                raise ValueError(why)
            fused = fuse_lora(model, d.device, fp8=fp8)  # the adapter inside the frozen GEMMs
            if fused and d.rank == 0:  # which kernels, for whoever compares runs' speeds
                ways = {getattr(m, "_tunedeck_epilogue", None) for m in model.modules()}
                named = ", ".join(sorted(ways - {None}))
                if "triton" in ways and not fp8:
                    named += f"; rank-r products: {lora_triton.rank_setting()}"
                    named += f"; tiles stored by: {lora_triton.gemm_setting()}"
                swiglu = sum(bool(getattr(m, "_tunedeck_swiglu", False)) for m in model.modules())
                if swiglu:  # TUNEDECK_LORA_EPILOGUE=triton-swiglu
                    named += f"; {swiglu} MLPs with SwiGLU in their GEMMs"
                print(f"{fused} LoRA linears fused ({named})")
        self.flat = spec.data.packing
        max_len = spec.data.max_length
        # Packed rows: document-aware varlen attention where the GPU runs it (no T×T mask).
        self.packed_max = 0
        if self.flat:
            why = check_varlen(d.device) if d.device.type == "cuda" else None
            if why is None:
                use_packed_attention(model)
                self.packed_max = max_len
            elif d.rank == 0:
                print(
                    f"warning: packed rows use SDPA with a block mask (slower): the varlen "
                    f"attention kernel is not usable here ({why})",
                    file=sys.stderr,
                    flush=True,
                )
        # torch.compile per decoder layer, where it pays (CUDA): one graph serves every layer
        # and FSDP2 units stay intact. Few shapes: padded batches in length buckets, packed
        # rows of one fixed length.
        self.compiler = None
        if compile_wanted(tr.compile, d.device):
            shapes = 1 if self.flat else len(length_buckets(max_len))
            # lean layers where the adapters are fused (measured for a 16-bit base in
            # docs/benchmarks.md; a fused 4-bit base saves the same tensors,
            # tests/test_train_qlora.py); full fine-tuning keeps torch's partition
            self.compiler = LayerCompiler(
                decoder_layers(model), shapes, events, d.rank, lean=fused > 0
            )
            self.compiler.setup()
        ce_kernel.follow_compile(tr.compile)  # the loss's chunk math compiles alongside
        self.loss_mod = CausalLMLoss(model, chunk=int(os.environ.get("TUNEDECK_LOSS_CHUNK", 0)))
        self.strategy = spec.parallel.strategy
        self.wrapped = wrap(
            self.loss_mod,
            self.strategy,
            d.device,
            d.world_size,
            self.dtype,
            cpu_offload=spec.parallel.cpu_offload,
        )
        self.wrapped.train()
        self.trainable_names = {n for n, p in self.loss_mod.named_parameters() if p.requires_grad}
        self.params = [p for p in self.loss_mod.parameters() if p.requires_grad]

        # No decay on biases and norms (1-d tensors), the usual AdamW practice.
        groups = [
            {"params": [p for p in self.params if p.ndim >= 2], "weight_decay": tr.weight_decay},
            {"params": [p for p in self.params if p.ndim < 2], "weight_decay": 0.0},
        ]
        fused = d.device.type == "cuda" and not spec.parallel.cpu_offload
        self.optimizer = torch.optim.AdamW(
            [g for g in groups if g["params"]], lr=tr.learning_rate, fused=fused
        )
        name = {"constant": "constant_with_warmup"}.get(tr.lr_scheduler, tr.lr_scheduler)
        self.scheduler = get_scheduler(
            name, self.optimizer, num_warmup_steps=tr.warmup_steps, num_training_steps=tr.max_steps
        )
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op).
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.dtype == torch.float16)

        if datasets is None:
            # torch's default collective timeout is 10 min (NCCL) when the spec sets none
            phase = TokenizeProgress(events.emit, spec.cluster.collective_timeout_s or 600, d.rank)
            datasets = load_datasets(spec.data, self.tokenizer, tr.seed, d.rank, phase)
        train_ds, eval_ds = datasets
        if self.flat:
            train_ds = PackedDataset(train_ds, spec.data.max_length, tr.seed)
        common = dict(
            num_workers=spec.data.num_workers,
            seed=tr.seed,
            rank=d.rank,
            world_size=d.world_size,
            pin_memory=d.device.type == "cuda",
            flat=self.flat,
            fixed_shapes=max_len if self.compiler else 0,
        )
        self.batches = Batches(make_loader(train_ds, batch_size=tr.per_device_batch_size, **common))
        self.eval_loader = None
        if eval_ds is not None:
            self.eval_loader = make_loader(
                eval_ds, batch_size=tr.per_device_batch_size, shuffle=False, **common
            )

        cfg = base_causal_lm(model).config
        self.flop_shape = dict(
            n_params=base_numel(model),
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            full=self.method == "full",
        )
        self.peak = peak_tflops(
            torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else None
        )
        self.resume()

        # Seams of the training loop: the batches a step takes, the forward it times as
        # compute, and hooks called with the number of steps done before and after each step.
        # Plain pass-throughs; test faults wrap them (see _install_test_faults).
        self.train_batches: Iterator[dict[str, torch.Tensor]] = self.batches
        self.train_forward: Callable[[dict[str, torch.Tensor]], torch.Tensor] = self._forward
        self.before_step: list[Callable[[int], None]] = []
        self.after_step: list[Callable[[int], None]] = []
        self._install_test_faults()
        if os.environ.get("TUNEDECK_MEM_TRACE"):  # where the peak goes (a debugging aid)
            from tunedeck.core.train import memtrace

            memtrace.install(self)

    def _install_test_faults(self) -> None:
        """Faults the tests inject (core/train/faults.py). The module is imported only when
        a test variable is set, so a production run never loads it."""
        if any(name.startswith(FAULTS_ENV_PREFIX) for name in os.environ):
            from tunedeck.core.train import faults

            faults.install(self)

    # -- resume ---------------------------------------------------------------------------
    def resume_source(self) -> Path | None:
        """Rank 0 decides (it reads the output folder); the others follow."""
        want = self.spec.train.resume_from
        if self.d.rank == 0:
            path = resume_point(want, self.output_dir, attempt(), nested=False)
            found = str(path) if path is not None else None
            if path is not None and not (path / ckpt.STATE_FILE).exists():
                found = (
                    f"train.resume_from: {path} is not a complete checkpoint (no {ckpt.STATE_FILE})"
                )
        else:
            found = None
        found = _bcast(found)
        if found and found.startswith("train.resume_from:"):
            raise FileNotFoundError(found)
        return Path(found) if found else None

    def resume(self) -> None:
        src = self.resume_source()
        if src is None:
            return
        r0 = self.d.rank == 0
        from safetensors.torch import load_file

        meta = ckpt.read_state(src) if r0 else None
        meta = _bcast(meta)
        if self.method == "full":
            sd = (
                {"model." + k: v for k, v in load_file(src / "model.safetensors").items()}
                if r0
                else {}
            )
        else:
            by_peft = {_peft_key(n): n for n in self.trainable_names}
            sd = (
                {
                    by_peft[k]: v
                    for k, v in load_file(src / "adapter_model.safetensors").items()
                    if k in by_peft
                }
                if r0
                else {}
            )
        load_model_state(self.loss_mod, sd)
        load_optimizer_state(
            self.loss_mod,
            self.optimizer,
            torch.load(src / "optimizer.pt", weights_only=False) if r0 else {},
        )
        self.scheduler.load_state_dict(
            _bcast(torch.load(src / "scheduler.pt", weights_only=False) if r0 else None)
        )
        rng = torch.load(src / ckpt.RNG_FILE, weights_only=False) if r0 else None
        same_world = meta.get("world_size") == self.d.world_size
        batches = meta.get("batches_in_epoch", 0)
        if not same_world:
            # Same samples consumed, re-cut for the new world size; exact only if divisible.
            batches = batches * meta["world_size"] // self.d.world_size
            if r0:
                print(
                    f"warning: resuming {meta['world_size']} ranks' checkpoint on "
                    f"{self.d.world_size}: RNG streams are not restored and the data "
                    f"position is approximate",
                    file=sys.stderr,
                    flush=True,
                )
        self.batches.epoch, self.batches.consumed = meta.get("epoch", 0), batches
        self.batches.prime()
        mine = [None]
        dist.scatter_object_list(
            mine, [rng[r] for r in range(self.d.world_size)] if r0 and same_world else None, src=0
        )
        if mine[0] is not None:
            ckpt.set_rng_state(mine[0])
        self.state.step, self.state.loss = meta["step"], meta.get("loss")
        self.state.resumed_from = str(src.resolve())
        if r0:
            print(
                f"resumed from {src} at step {meta['step']} (epoch {self.batches.epoch}, "
                f"batch {batches})",
                flush=True,
            )

    # -- one optimizer step ---------------------------------------------------------------
    def _autocast(self):
        return torch.autocast(
            self.d.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32
        )

    def _forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        kw = forward_inputs(b, self.d.device, self.packed_max)
        if self.compiler is not None and "cu_seq_lens_q" in kw:
            # the number of documents varies: one graph for all counts
            import torch._dynamo

            torch._dynamo.maybe_mark_dynamic(kw["cu_seq_lens_q"], 0)
        with self._autocast(), _sdpa_priority():
            return self.wrapped(**kw)

    def _micro_steps(self, micro: list, n_labels: int):
        """Forward and backward of the step's micro-batches: (summed loss, forward timer)."""
        loss_sum = torch.zeros((), device=self.d.device, dtype=torch.float64)
        timer = ForwardTimer(self.d.device)
        for i, b in enumerate(micro):
            if self.compiler is not None:
                self.compiler.before(_shape_key(b), self.state.step)
            with grad_sync(self.wrapped, i == len(micro) - 1):
                timer.start()
                loss = self.train_forward(b)
                timer.stop()
                self.scaler.scale(loss / max(n_labels, 1)).backward()
            loss_sum += loss.detach()
        return loss_sum, timer

    def step(self) -> dict:
        tr, dev = self.spec.train, self.d.device
        t0 = time.perf_counter()
        wait = 0.0
        micro = []
        for _ in range(tr.grad_accum):
            tw = time.perf_counter()
            micro.append(next(self.train_batches))
            wait += time.perf_counter() - tw
        # Counted on the CPU copies: no GPU sync. Normalise by label tokens of the whole step
        # so each token weighs the same, whatever micro-batch it landed in.
        n_labels = sum(int((b["targets"] != IGNORE).sum()) for b in micro)
        doc_lens = [int(x) for b in micro for x in b["doc_lens"]]
        try:
            loss_sum, timer = self._micro_steps(micro, n_labels)
        except Exception as e:
            c = self.compiler
            if c is None or not c.enabled or not is_compile_error(e):
                raise
            # compiling failed: the step again, eager, from clean gradients
            self.optimizer.zero_grad(set_to_none=True)
            c.fall_back(e, self.state.step)
            loss_sum, timer = self._micro_steps(micro, n_labels)
        self.scaler.unscale_(self.optimizer)
        max_norm = tr.max_grad_norm if tr.max_grad_norm > 0 else float("inf")
        grad_norm = clip_grad_norm(self.params, max_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

        # Host numbers enter by fill kernels (scalar arguments), not host→device copies, which
        # from pageable memory can wait for the GPU.
        stats = torch.empty(4, device=dev, dtype=torch.float64)
        stats[0].copy_(loss_sum)
        stats[1].fill_(float(n_labels))
        stats[2].fill_(float(self.stop.requested))
        stats[3].copy_(grad_norm.detach())
        dist.all_reduce(stats)
        s_loss, s_labels, s_stop, s_norm = all_reduce_result(stats)  # the step's one host sync
        step_s = time.perf_counter() - t0
        tokens = sum(doc_lens)
        if self.compiler is not None:
            self.compiler.after_step(self.state.step + 1, step_s)
        return {
            "loss": s_loss / max(s_labels, 1.0),
            "lr": lr,
            "grad_norm": s_norm / self.d.world_size,
            "tokens": tokens,
            "label_tokens": n_labels,
            "step_s": step_s,
            "data_wait_s": wait,
            "compute_s": timer.total(),
            "mem_gib": self._mem_gib(),
            **self._reserved_gib(),
            "tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "mfu": mfu(step_flops(doc_lens=doc_lens, **self.flop_shape), step_s, self.peak),
            "_stop": s_stop > 0,
        }

    def _reserved_gib(self) -> dict:
        if self.d.device.type != "cuda":
            return {}
        return {"mem_reserved_gib": torch.cuda.max_memory_reserved(self.d.device) / GIB}

    def _mem_gib(self) -> float:
        if self.d.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.d.device) / GIB
        return psutil.Process().memory_info().rss / GIB

    # -- eval -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Loss over the whole eval set, token-weighted over all ranks."""
        self.wrapped.eval()
        dev = self.d.device
        tot = torch.zeros(2, device=dev, dtype=torch.float64)
        for b in self.eval_loader:
            if self.compiler is not None:
                self.compiler.before(_shape_key(b) + ("eval",), self.state.step)
            tot[0] += self._forward(b).to(torch.float64)
            tot[1] += float((b["targets"] != IGNORE).sum())
        self.wrapped.train()
        dist.all_reduce(tot)
        loss, n = tot.tolist()
        return {"eval_loss": loss / max(n, 1.0), "eval_tokens": int(n)}

    # -- checkpoints ----------------------------------------------------------------------
    def save(self) -> None:
        st, tr = self.state, self.spec.train
        # Collectives first, on every rank: full (unsharded) states land on rank 0's CPU.
        model_sd = full_model_state(self.loss_mod, trainable_only=self.method != "full")
        optim_sd = full_optimizer_state(self.loss_mod, self.optimizer)
        rngs = [None] * self.d.world_size if self.d.rank == 0 else None
        dist.gather_object(ckpt.rng_state(), rngs, dst=0)
        if self.d.rank == 0:

            def write(tmp: Path) -> None:
                self._write_weights(tmp, model_sd)
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(tmp)
                torch.save(optim_sd, tmp / "optimizer.pt")
                torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
                torch.save(dict(enumerate(rngs)), tmp / ckpt.RNG_FILE)

            path = ckpt.write_checkpoint(
                self.output_dir,
                st.step,
                write,
                {
                    "step": st.step,
                    **self.batches.position(),
                    "seed": tr.seed,
                    "loss": st.loss,
                    "max_steps": tr.max_steps,
                    "world_size": self.d.world_size,
                    "per_device_batch_size": tr.per_device_batch_size,
                    "grad_accum": tr.grad_accum,
                    "method": self.method,
                    "strategy": self.strategy,
                    "model": self.spec.model.path,
                },
            )
            self.events.emit("checkpoint", step=st.step, path=str(path.resolve()))
            self.events.sync()
            ckpt.rotate(
                self.output_dir,
                tr.save_total_limit,
                protect=Path(st.resumed_from) if st.resumed_from else None,
            )
        dist.barrier()

    def _write_weights(self, tmp: Path, sd: dict) -> None:
        from safetensors.torch import save_file

        lm = base_causal_lm(self.model)
        if self.method == "full":
            out = {k.removeprefix("model."): v for k, v in sd.items()}
            if getattr(lm.config, "tie_word_embeddings", False):
                out.pop("lm_head.weight", None)  # shared with the embeddings; saved once
            save_file(
                {k: v.contiguous() for k, v in out.items()},
                tmp / "model.safetensors",
                metadata={"format": "pt"},
            )
            lm.config.save_pretrained(tmp)
            if getattr(lm, "generation_config", None) is not None:
                lm.generation_config.save_pretrained(tmp)
            return
        out = {_peft_key(k): v.contiguous() for k, v in sd.items() if k in self.trainable_names}
        save_file(out, tmp / "adapter_model.safetensors", metadata={"format": "pt"})
        self.model.peft_config["default"].save_pretrained(tmp)

    def merge(self, path: Path) -> Path:
        """Base model + adapter, merged, as a plain transformers folder: <ckpt>/merged/."""
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base_dir, _builtin = self.model_path
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=self.dtype)
        merged = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
        tmp = path / ".merged.tmp"
        merged.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        os.rename(tmp, path / "merged")
        return path / "merged"

    # -- the run --------------------------------------------------------------------------
    def stop_before_start(self) -> bool:
        """A stop requested before the first step (stop.json, or a SIGTERM while the model was
        being built): every rank agrees through one all-reduce, so all of them leave."""
        return stop_agreed(self.stop, self.stop_file, self.d.device)

    def run(self) -> str:
        spec, st = self.spec, self.state
        tr = spec.train
        trainable, total = count_params(self.loss_mod)
        start = dict(
            world_size=self.d.world_size,
            device=str(self.d.device),
            model=spec.model.path,
            method=self.method,
            strategy=self.strategy,
            dtype=str(self.dtype).removeprefix("torch."),
            trainable_params=trainable,
            total_params=total,
            max_steps=tr.max_steps,
            restart=attempt(),
            start_step=st.step,
        )
        if st.resumed_from:
            start["resumed_from"] = st.resumed_from
        self.events.emit("start", **start)
        if self.stop_before_start():
            # nothing trained in this attempt: no checkpoint to write, a clean exit
            self.events.emit("end", step=st.step, reason="stopped", loss=st.loss)
            self.events.sync()
            if self.d.rank == 0:
                print(f"stopped before step {st.step + 1}: a stop was requested", flush=True)
            return "stopped"
        log_every = max(1, tr.max_steps // 50)
        stopped = False
        early = EarlyStop(tr.early_stop_patience, tr.early_stop_min_delta)
        while st.step < tr.max_steps:
            for hook in self.before_step:
                hook(st.step)
            m = self.step()
            stopped = m.pop("_stop")
            st.step += 1
            st.loss = m["loss"]
            self.events.emit("step", step=st.step, epoch=self.batches.epoch, **m)
            if self.d.rank == 0 and (
                st.step % log_every == 0 or st.step in (1, tr.max_steps) or stopped
            ):
                print(
                    f"step {st.step}/{tr.max_steps} loss {m['loss']:.4f} lr {m['lr']:.3g} "
                    f"grad_norm {m['grad_norm']:.3f} {m['step_s'] * 1000:.0f} ms",
                    flush=True,
                )
            if stopped:
                break
            if self.eval_loader is not None and tr.eval_steps and st.step % tr.eval_steps == 0:
                ev = self.evaluate()
                self.events.emit("eval", step=st.step, **ev)
                # every rank holds the same all-reduced eval loss: they all stop here
                if early.stops(ev["eval_loss"]):
                    break
            if tr.save_steps and st.step % tr.save_steps == 0 and st.step < tr.max_steps:
                self.save()
            for hook in self.after_step:
                hook(st.step)
        if self.save_at_end:
            self.save()
        final = ckpt.checkpoint_path(self.output_dir, st.step)
        if (
            self.save_at_end
            and self.d.rank == 0
            and spec.method.merge_lora
            and self.method != "full"
            and self.model_path is not None
        ):
            print(f"merged model in {self.merge(final)}", flush=True)
        dist.barrier()
        reason = "stopped" if stopped and st.step < tr.max_steps else "completed"
        reason = "early_stop" if early.why else reason
        self.events.emit("end", step=st.step, reason=reason, loss=st.loss, **early.note())
        self.events.sync()
        if self.d.rank == 0:
            said = f"early stop ({early.why})" if early.why else reason
            print(f"{said} at step {st.step}; checkpoint in {self.output_dir}", flush=True)
        return reason


class EarlyStop:
    """train.early_stop_patience evals in a row whose eval loss is not below the best by
    more than train.early_stop_min_delta end the run (with its final checkpoint)."""

    def __init__(self, patience: int, min_delta: float):
        self.patience, self.min_delta = patience, min_delta
        self.best = float("inf")
        self.bad = 0
        self.why = ""

    def stops(self, loss: float) -> bool:
        if not self.patience:
            return False
        if loss < self.best - self.min_delta:
            self.best, self.bad = loss, 0
            return False
        self.bad += 1
        if self.bad >= self.patience:
            self.why = (
                f"eval loss did not improve on {self.best:.4f} by more than "
                f"{self.min_delta:g} in {self.bad} evals"
            )
        return bool(self.why)

    def note(self) -> dict:
        return {"early_stop": self.why} if self.why else {}


STACK_POLL_S = 0.25


def _register_stack_dump(run: RunDir) -> None:
    """`tunedeck stacks` asks a rank for its Python stacks by touching stacks/rank<r>.request
    (core/supervisor/stacks.py); a daemon thread of the rank answers within STACK_POLL_S,
    appending every thread's stack to stacks/rank<r>.txt, not stderr: in the rank's log a
    dump reads as a traceback to people and to the diagnosis.

    A thread holding the GIL, not faulthandler on a signal: a signal handler walks the
    threads' states while other threads create and delete theirs (gloo's callbacks into
    Python do, every step), and a rank training under DDP died of SIGSEGV mid-dump. A rank
    blocked in a collective releases the GIL, so the thread still answers."""
    rank = int(os.environ.get("RANK", "0") or 0)
    path, request = run.stack_file(rank), run.stack_request(rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the request file first: its presence tells `stacks` that this rank answers
        # requests (a rank of an older tunedeck made only the dump file)
        request.touch()
        out = open(path, "a", encoding="utf-8")
    except OSError:  # no dump file: no dumps
        return

    def dump() -> None:
        faulthandler.dump_traceback(file=out, all_threads=True)
        out.flush()

    flight.answer_requests(request, dump, "tunedeck-stacks", STACK_POLL_S)


def main(run_dir: str | Path) -> int:
    stop = StopFlag()
    stop.install()  # first, so a stop during model loading is not lost
    # Segments that grow in place: reserved memory stays near allocated (shapes vary).
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we fork DataLoader workers
    # bitsandbytes (QLoRA, quantized checkpoints) warns on some CPUs that an optional kernel
    # package is missing: noise in every rank's log
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    run_dir = Path(run_dir).resolve()
    _register_stack_dump(RunDir(run_dir))
    flight.serve(run_dir)  # Flight Recorder dumps when the agent sees a stall
    spec = load_spec(RunDir(run_dir).spec)
    # Before the process group: building the demo model calls save_pretrained, which
    # transformers skips on ranks != 0 once torch.distributed is initialized.
    model_path = resolve_model_path(spec)
    keep_out_bitsandbytes(spec, model_path[0])  # before peft is first imported
    d = init_distributed(spec)
    events = EventWriter(run_dir, d.rank)
    if attempt() == 0 and stop_agreed(stop, RunDir(run_dir).stop_request, d.device):
        # stopped before anything was built (a stop in the launch's first seconds): leave
        # at once, cleanly; a later request is caught again before the first step
        events.emit("end", step=0, reason="stopped", loss=None)
        events.close()
        if d.rank == 0:
            print("stopped before the model was built: a stop was requested", flush=True)
        _leave_process_group(False)
        return 0
    trainer = None
    failed = True
    try:
        trainer = Trainer(spec, run_dir, d, events, stop, model_path)
        trainer.run()
        failed = False
    except BaseException as e:
        st = trainer.state if trainer else TrainState()
        events.emit(
            "end",
            step=st.step,
            reason="failed",
            loss=st.loss,
            error=f"{type(e).__name__}: {e}".splitlines()[0][:500],
        )
        if not isinstance(e, Exception):
            raise  # Ctrl-C, SystemExit: as they are
        # Printed now, not on the way out: the teardown below may end the process. With the
        # "[rank<r>]:" prefix torch.distributed gives uncaught exceptions.
        for line in traceback.format_exc().splitlines():
            print(f"[rank{d.rank}]: {line}", file=sys.stderr)
        sys.stderr.flush()
        return 1
    finally:
        events.close()
        _leave_process_group(failed)
    return 0


FAILED_EXIT_S = 10.0


def _leave_process_group(failed: bool) -> None:
    """After a failure the other ranks may sit in a collective that never completes, and a
    graceful NCCL destroy then waits for them forever: on 2xH200 a rank whose DataLoader
    worker was killed hung here, so torchrun never saw it fail and both GPUs stayed held.
    A failed rank aborts its communicators instead, and exits anyway if even that does not
    return within FAILED_EXIT_S; torchrun then stops the others."""
    if not dist.is_initialized():
        return
    if not failed:
        dist.destroy_process_group()
        return
    sys.stdout.flush()
    timer = threading.Timer(FAILED_EXIT_S, os._exit, (1,))
    timer.daemon = True
    timer.start()
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        if dist.get_backend() == "nccl" and abort is not None:
            abort()
        else:
            dist.destroy_process_group()
    except Exception as e:  # the rank is failing already; its own error is what matters
        print(
            f"leaving the process group failed: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
    timer.cancel()


if __name__ == "__main__":  # pragma: no cover - use python -m tunedeck.core.train
    sys.exit(main(sys.argv[1]))
