"""The built-in trainer: causal-LM fine-tuning (full or LoRA) under DDP, started by torchrun.

Per optimizer step: fetch grad_accum micro-batches (timing the waits), forward/backward each
(no_sync on all but the last), clip, step, then ONE all-reduce of
[loss sum, label tokens, stop flag, grad norm]. That collective gives every rank the global
loss and the same stop decision, so all ranks stop after the same step.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from core.spec import RunSpec, load_spec
from core.train.checkpoint import write_checkpoint
from core.train.data import IGNORE, Batches, ChatDataset, make_loader
from core.train.events import EventWriter
from core.train.model import build_model, compute_dtype, count_params, load_tokenizer, \
    resolve_model_path

GIB = 2 ** 30


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
    epoch: int = 0
    loss: float | None = None
    resumed_from: str | None = None


@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def init_distributed(spec: RunSpec) -> Dist:
    try:
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
    except KeyError as e:
        raise SystemExit(f"core.train: {e.args[0]} is not set; start me with torchrun "
                         f"(python -m torch.distributed.run ... -m core.train --run-dir DIR)")
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
    dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return Dist(rank, local_rank, world, device)


class Trainer:
    def __init__(self, spec: RunSpec, run_dir: Path, d: Dist, events: EventWriter,
                 stop: StopFlag, model_path: tuple[Path, bool]):
        from transformers import get_scheduler, set_seed
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # bars fill rank logs with carriage returns
        self.spec, self.d, self.events, self.stop = spec, d, events, stop
        self.output_dir = Path(spec.run.output_dir or run_dir / "output").expanduser()
        self.state = TrainState()
        tr = spec.train
        set_seed(tr.seed)  # same LoRA init and dropout stream on every rank

        path, builtin = model_path
        self.tokenizer = load_tokenizer(path, builtin)
        self.dtype = compute_dtype(spec.model.dtype, d.device)
        model, self.method = build_model(spec, path, d.device, self.dtype)
        self.model = model
        self.ddp = DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
        self.ddp.train()
        self.params = [p for p in model.parameters() if p.requires_grad]

        # No decay on biases and norms (1-d tensors), the usual AdamW practice.
        groups = [
            {"params": [p for p in self.params if p.ndim >= 2], "weight_decay": tr.weight_decay},
            {"params": [p for p in self.params if p.ndim < 2], "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]],
                                           lr=tr.learning_rate,
                                           fused=d.device.type == "cuda")
        name = {"constant": "constant_with_warmup"}.get(tr.lr_scheduler, tr.lr_scheduler)
        self.scheduler = get_scheduler(name, self.optimizer, num_warmup_steps=tr.warmup_steps,
                                       num_training_steps=tr.max_steps)
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op).
        self.scaler = torch.amp.GradScaler(d.device.type,
                                           enabled=self.dtype == torch.float16)

        dataset = ChatDataset(spec.data.path, self.tokenizer, spec.data.max_length)
        loader = make_loader(dataset, batch_size=tr.per_device_batch_size,
                             num_workers=spec.data.num_workers, seed=tr.seed, rank=d.rank,
                             world_size=d.world_size, pin_memory=d.device.type == "cuda")
        self.batches = Batches(loader, epoch=self.state.epoch)

    # -- one optimizer step -------------------------------------------------------------
    def _autocast(self):
        return torch.autocast(self.d.device.type, dtype=self.dtype,
                              enabled=self.dtype != torch.float32)

    def _micro_loss(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed token loss of one micro-batch (normalised by the caller)."""
        with self._autocast():
            logits = self.ddp(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), b["labels"][:, 1:].flatten(),
                               ignore_index=IGNORE, reduction="sum")

    def step(self) -> dict:
        tr, dev = self.spec.train, self.d.device
        t0 = time.perf_counter()
        wait = 0.0
        micro = []
        for _ in range(tr.grad_accum):
            tw = time.perf_counter()
            micro.append(next(self.batches))
            wait += time.perf_counter() - tw
        # Normalise by label tokens of the whole step so each token weighs the same,
        # whatever micro-batch it landed in.
        n_labels = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in micro)
        tokens = sum(int(b["attention_mask"].sum()) for b in micro)
        loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
        for i, b in enumerate(micro):
            b = {k: v.to(dev, non_blocking=True) for k, v in b.items()}
            last = i == len(micro) - 1
            with nullcontext() if last else self.ddp.no_sync():
                loss = self._micro_loss(b)
                self.scaler.scale(loss / max(n_labels, 1)).backward()
            loss_sum += loss.detach()
        self.scaler.unscale_(self.optimizer)
        max_norm = tr.max_grad_norm if tr.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

        stats = torch.stack([loss_sum, torch.tensor(float(n_labels), device=dev,
                                                    dtype=torch.float64),
                             torch.tensor(float(self.stop.requested), device=dev,
                                          dtype=torch.float64),
                             grad_norm.detach().to(torch.float64)])
        dist.all_reduce(stats)
        s_loss, s_labels, s_stop, s_norm = stats.tolist()
        step_s = time.perf_counter() - t0
        return {"loss": s_loss / max(s_labels, 1.0), "lr": lr,
                "grad_norm": s_norm / self.d.world_size, "tokens": tokens,
                "step_s": step_s, "data_wait_s": wait, "mem_gib": self._mem_gib(),
                "tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
                "_stop": s_stop > 0}

    def _mem_gib(self) -> float:
        if self.d.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.d.device) / GIB
        return psutil.Process().memory_info().rss / GIB

    # -- checkpoints --------------------------------------------------------------------
    def save(self) -> None:
        st = self.state
        if self.d.rank == 0:
            tr = self.spec.train
            path = write_checkpoint(
                self.output_dir, st.step, self.model, self.tokenizer, self.optimizer,
                self.scheduler,
                {"step": st.step, "epoch": self.batches.epoch, "seed": tr.seed, "loss": st.loss,
                 "max_steps": tr.max_steps, "world_size": self.d.world_size,
                 "per_device_batch_size": tr.per_device_batch_size,
                 "grad_accum": tr.grad_accum, "method": self.method,
                 "model": self.spec.model.path})
            self.events.emit("checkpoint", step=st.step, path=str(path.resolve()))
            self.events.sync()
        dist.barrier()

    # -- the run ------------------------------------------------------------------------
    def run(self) -> str:
        spec, st = self.spec, self.state
        tr = spec.train
        trainable, total = count_params(self.model)
        start = dict(world_size=self.d.world_size, device=str(self.d.device),
                     model=spec.model.path, method=self.method,
                     dtype=str(self.dtype).removeprefix("torch."),
                     trainable_params=trainable, total_params=total, max_steps=tr.max_steps,
                     restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        if st.resumed_from:
            start["resumed_from"] = st.resumed_from
        self.events.emit("start", **start)
        log_every = max(1, tr.max_steps // 50)
        stopped = False
        while st.step < tr.max_steps:
            m = self.step()
            stopped = m.pop("_stop")
            st.step += 1
            st.loss = m["loss"]
            self.events.emit("step", step=st.step, **m)
            if self.d.rank == 0 and (st.step % log_every == 0 or st.step in (1, tr.max_steps)
                                     or stopped):
                print(f"step {st.step}/{tr.max_steps} loss {m['loss']:.4f} lr {m['lr']:.3g} "
                      f"grad_norm {m['grad_norm']:.3f} {m['step_s'] * 1000:.0f} ms", flush=True)
            if stopped:
                break
            if tr.save_steps and st.step % tr.save_steps == 0 and st.step < tr.max_steps:
                self.save()
        self.save()
        reason = "stopped" if stopped and st.step < tr.max_steps else "completed"
        self.events.emit("end", step=st.step, reason=reason, loss=st.loss)
        self.events.sync()
        if self.d.rank == 0:
            print(f"{reason} at step {st.step}; checkpoint in {self.output_dir}", flush=True)
        return reason


def main(run_dir: str | Path) -> int:
    stop = StopFlag()
    stop.install()  # first, so a stop during model loading is not lost
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we fork DataLoader workers
    run_dir = Path(run_dir).resolve()
    spec = load_spec(run_dir / "spec.toml")
    # Before the process group: building the demo model calls save_pretrained, which
    # transformers skips on ranks != 0 once torch.distributed is initialized.
    model_path = resolve_model_path(spec)
    d = init_distributed(spec)
    events = EventWriter(run_dir, d.rank)
    trainer = None
    try:
        trainer = Trainer(spec, run_dir, d, events, stop, model_path)
        trainer.run()
    except BaseException as e:
        st = trainer.state if trainer else TrainState()
        events.emit("end", step=st.step, reason="failed", loss=st.loss,
                    error=f"{type(e).__name__}: {e}".splitlines()[0][:500])
        raise
    finally:
        events.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover - use python -m core.train
    sys.exit(main(sys.argv[1]))
