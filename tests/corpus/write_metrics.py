"""Write the corpus's metrics logs: one per framework's console format, each with its last
step and loss in tests/corpus/metrics.json. The line shapes follow the public logs named beside
each (our own numbers and words).

    .venv/bin/python tests/corpus/write_metrics.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "metrics"
N = 30


def loss(i: int) -> float:
    return round(2.8 * math.exp(-i / 40) + 0.9 + 0.03 * math.sin(i), 4)


def bar(i, n, desc="", extra=""):
    pct = i * 100 // n
    return (
        f"{desc}{pct:3d}%|{'█' * (pct // 10):<10}| {i}/{n} [00:{i % 60:02d}<00:{(n - i) % 60:02d}, "
        f" 1.{i % 9}0it/s{extra}]"
    )


LOGS: dict[str, tuple[str, callable]] = {}


def log(name, url):
    def deco(fn):
        LOGS[name] = (url, fn)
        return fn

    return deco


@log("megatron_lm.log", "https://github.com/epfLLM/Megatron-LLM/issues/11")
def _():
    return (
        [
            f" iteration {i:8d}/{N * 10:8d} | consumed samples: {i * 1024:12d} | elapsed time per "
            f"iteration (ms): {860.0 + i:.1f} | learning rate: {1e-5 * i / N:.3E} | global batch "
            f"size:  1024 | lm loss: {loss(i):.6E} | loss scale: 1.0 | grad norm: {0.2 + i / 100:.3f}"
            f" | number of skipped iterations:   0 | number of nan iterations:   0 |"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("megatron_deepspeed_timestamped.log", "https://github.com/epfLLM/Megatron-LLM/issues/11")
def _():
    return (
        [
            f"[2024-06-10 12:{i % 60:02d}:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] "
            f"step={i}, skipped=0, lr=[1e-05], mom=[(0.9, 0.95)]\n"
            f" iteration {i:9d}/ {N:9d} | consumed samples: {i * 8:10d} | elapsed time per "
            f"iteration (ms): 512.3 | learning rate: 1.000E-05 | global batch size: 8 | "
            f"lm loss: {loss(i):.6E} | loss scale: 4096.0 | grad norm: 1.234 | actual seqlen:  2048 |"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log(
    "deepspeed_steps.log",
    "DeepSpeed engine's steps_per_print line (no public report found with this exact shape)",
)
def _():
    return (
        [
            f"steps: {i * 10} loss: {loss(i):.4f} iter time (s): 0.{500 + i} samples/sec: 15.6"
            for i in range(1, N + 1)
        ],
        N * 10,
        loss(N),
    )


@log("torchtune.log", "https://github.com/meta-pytorch/torchtune/pull/2620")
def _():
    return [f"1|{i}|Loss: {loss(i)}: " + bar(i + 1, N + 5) for i in range(1, N + 1)], N, loss(N)


@log("torchtune_torchx_prefix.log", "https://github.com/meta-pytorch/torchtune/pull/2620")
def _():
    return (
        [
            f"[trainer0|0]:1|{i}|Loss: {loss(i)}: " + bar(i + 1, N + 5) + "[trainer0|0]:"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("litgpt.log", "https://github.com/Lightning-AI/litgpt/issues/834")
def _():
    return (
        [
            f"iter {i} step {(i + 1) // 2}: loss {loss(i):.4f}, iter time: 18{i % 10}.97ms"
            + (" (optimizer.step)" if i % 2 == 0 else "")
            for i in range(1, 2 * N + 1)
        ],
        N,
        loss(2 * N),
    )


@log("litgpt_new.log", "https://github.com/Lightning-AI/litgpt/issues/1224")
def _():
    return (
        [
            f"Epoch 1 | iter {i} step {i // 4} | loss train: {loss(i):.3f}, val: n/a | iter "
            f"time: 45.{i % 10}3 ms" + (" (step)" if i % 4 == 0 else "")
            for i in range(4, 4 * N + 1)
        ],
        N,
        round(loss(4 * N), 3),
    )


@log("lit_llama.log", "https://github.com/Lightning-AI/lit-llama/pull/52")
def _():
    return (
        [f"iter {i}: loss {loss(i):.4f}, time: 12{i % 10}.45ms" for i in range(N)],
        N - 1,
        loss(N - 1),
    )


@log("lightning_tqdm.log", "https://github.com/Lightning-AI/pytorch-lightning/issues/4225")
def _():
    lines = []
    for ep in range(2):
        for i in range(1, 16):
            lines.append(
                bar(i, 15, f"Epoch {ep}: ", f", v_num=3, train_loss={loss(ep * 15 + i):.3f}")
            )
    return ["\r".join(lines[k : k + 5]) for k in range(0, len(lines), 5)], 30, round(loss(30), 3)


@log("lightning_rich.log", "https://github.com/Lightning-AI/pytorch-lightning/issues/4225")
def _():
    return (
        [
            f"Epoch {ep}/1  ━━━━━━━━━━━━━━━━━━━━ {i}/15 0:00:{i:02d} • 0:00:{15 - i:02d} 5.37it/s "
            f"v_num: 3 train_loss: {loss(ep * 15 + i):.3f}"
            for ep in range(2)
            for i in range(1, 16)
        ],
        30,
        round(loss(30), 3),
    )


@log("accelerate_print.log", "no public report: the f-string print many accelerate scripts use")
def _():
    return (
        [f"epoch 0 step {i}: {{'train_loss': {loss(i)}, 'lr': 2e-05}}" for i in range(1, N + 1)],
        N,
        loss(N),
    )


@log("hf_trainer_tqdm.log", "https://github.com/hiyouga/LlamaFactory/issues/8261")
def _():
    out = []
    for i in range(1, N + 1):
        out.append(bar(i, N))
        out.append(
            str(
                {"loss": loss(i), "grad_norm": 1.1, "learning_rate": 2e-5, "epoch": round(i / N, 2)}
            )
        )
    return out, N, loss(N)


@log("hf_trainer_rank_prefix.log", "https://github.com/hiyouga/LlamaFactory/issues/7396")
def _():
    return (
        [
            f"[rank0]:{ {'loss': loss(i), 'grad_norm': 0.9, 'learning_rate': 1e-5, 'epoch': round(i / N, 2)} }".replace(
                "{ {", "{"
            ).replace("} }", "}")
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("swift_srun_prefix.log", "https://github.com/modelscope/ms-swift/issues/5884")
def _():
    return (
        [
            f"0: {{'loss': '{loss(i)}', 'grad_norm': '1.2', 'learning_rate': '9e-05', 'epoch': "
            f"'{i / N:.2f}', 'global_step/max_steps': '{i}/{N}', 'train_speed(s/it)': '0.5'}}"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("swift_timestamped.log", "https://github.com/modelscope/ms-swift/issues/7992")
def _():
    return (
        [
            f"[INFO:swift] 2025-02-05 18:{i % 60:02d}:00 {{'loss': {loss(i)}, 'learning_rate': 1e-05, "
            f"'global_step/max_steps': '{i}/{N}'}}"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("torchtitan.log", "https://github.com/pytorch/torchtitan/pull/2389")
def _():
    return (
        [
            f"\x1b[31mstep: {i:2d}  \x1b[32mloss: {loss(i):7.4f}  \x1b[33mmemory: 30.12GiB(31.70%)  "
            f"\x1b[34mtps: 4,120  \x1b[35mmfu: 38.20%\x1b[39m"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("plain_print.log", "https://github.com/Lightning-AI/litgpt/issues/689")
def _():
    return [f"step {i} | loss {loss(i):.4f} | lr 0.0003" for i in range(1, N + 1)], N, loss(N)


@log("k8s_hf_trainer.log", "https://github.com/aws/aws-ofi-nccl/issues/889")
def _():
    return (
        [
            f"2024-05-14T09:12:{i % 60:02d}.123456Z {{'loss': {loss(i)}, 'learning_rate': 2e-05, "
            f"'epoch': {i / N:.2f}}}"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("dllogger_iterations.log", "https://github.com/NVIDIA/DeepLearningExamples/issues/1107")
def _():
    return (
        [
            f"DLL 2024-01-09 07:{i // 60:02d}:{i % 60:02d}.500123 - Training Epoch: 0 Training "
            f"Iteration: {i * 25}  step_loss : {loss(i)}  learning_rate : {2e-5 * (1 - i / N):.6e} "
            for i in range(1, N + 1)
        ]
        + ["DLL 2024"],
        N * 25,
        loss(N),
    )


@log(
    "lightning_bar_without_bar.log", "https://github.com/Lightning-AI/pytorch-lightning/issues/3866"
)
def _():
    n = 400
    return (
        [
            f"Epoch 0:  {i * 100 // n}% {i}/{n} [0{i // 60}:{i % 60:02d}<0{(n - i) // 60}:"
            f"{(n - i) % 60:02d},  3.1{i % 9}it/s, loss={loss(i)}, v_num=2]"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("neox_lm_loss_then_ds_step.log", "https://github.com/deepspeedai/DeepSpeed/issues/3742")
def _():
    lines = []
    for i in range(1, N + 1):
        lines.append(
            f" samples/sec: 8.120 | iteration {i:8d}/{N * 100:8d} | elapsed time per "
            f"iteration (ms): {3900.0 + i:.1f} | learning rate: {1e-6 * i:.3E} | "
            f"lm_loss: {loss(i):.6E} | number of skipped iterations:   0 |"
        )
        lines.append(
            f"[2024-02-01 10:00:{i % 60:02d},101] [INFO] [logging.py:96:log_dist] "
            f"[Rank 0] step={i + 1}, skipped=0, lr=[{1e-6 * (i + 1)}], mom=[[0.9, 0.95]]"
        )
    return lines, N, loss(N)


@log("fairseq_progress.log", "https://github.com/facebookresearch/fairseq/issues/301")
def _():
    per = 900
    return (
        [
            f"| epoch 002:  {i * 10:4d} / {per} loss={loss(i):.3f} ({loss(i) + 0.2:.3f}), "
            f"wps=1021, wpb=870, bsz=24, lr=0.0005, clip=100%, gnorm={1.5 + i / 100:.4f}"
            for i in range(1, N + 1)
        ],
        per + N * 10,
        round(loss(N), 3),
    )


@log("json_stats_prefix.log", "https://github.com/facebookresearch/Detectron/issues/610")
def _():
    return (
        [
            f'json_stats: {{"eta": "1:0{i % 10}:00", "iter": {i * 20}, "loss": {loss(i)}, '
            f'"loss_cls": 0.01, "lr": 0.002, "mem": 6120, "time": 0.41}}'
            for i in range(1, N + 1)
        ],
        N * 20,
        loss(N),
    )


@log("trainer_log_current_steps.jsonl", "https://github.com/hiyouga/LLaMA-Factory/issues/774")
def _():
    return (
        [
            json.dumps(
                {
                    "current_steps": i * 10,
                    "total_steps": N * 10,
                    "loss": loss(i),
                    "eval_loss": None,
                    "learning_rate": 1e-5,
                    "epoch": round(i / N, 2),
                    "percentage": round(100 * i / N, 2),
                }
            )
            for i in range(1, N + 1)
        ],
        N * 10,
        loss(N),
    )


@log("yolox_style_key_values.log", "https://github.com/Megvii-BaseDetection/YOLOX/issues/827")
def _():
    per = 500
    return (
        [
            f"2024-04-02 10:{i // 60:02d}:{i % 60:02d} | INFO     | det.trainer:201 - epoch: 3/30, "
            f"iter: {i * 10}/{per}, mem: 20110Mb, iter_time: 1.1s, total_loss: {loss(i)}, "
            f"iou_loss: 2.1, cls_loss: 0.4, lr: 1.0e-02"
            for i in range(1, N + 1)
        ],
        2 * per + N * 10,
        loss(N),
    )


@log("epoch_bracket_loss_equals.log", "https://github.com/dk-liang/CLTR/issues/27")
def _():
    return (
        [
            f"2024-05-01 08:{i % 60:02d}:00,101 - MYNET - INFO - Training Epoch:[{i}/300]\t "
            f"loss={loss(i)}\t lr=0.000100"
            for i in range(1, N + 1)
        ],
        N,
        loss(N),
    )


@log("timm_style_epoch_local.log", "https://github.com/facebookresearch/deit/issues/150")
def _():
    per = 1000
    return (
        [
            f"Train: [{i}/{per}]"
            if False
            else f"Train - Epoch: [12/100][{i * 10:>4}/{per}]\tTime  0.701 ( 0.712)\tData  0.001 "
            f"( 0.010)\tLoss {loss(i):.4e} ({loss(i) + 0.1:.4e})"
            for i in range(1, N + 1)
        ],
        11 * per + N * 10,
        float(f"{loss(N):.4e}"),
    )


@log("pipe_separated_batch_loss.log", "https://github.com/ylsung/VL_adapter/issues/4")
def _():
    return (
        [
            f"epoch   1 | lr 0.000200 | batch {i * 50:>6} | examples/s:  20.{i % 9} | loss: "
            f"{loss(i):.5f} | time elapsed: 00h0{i % 10}m00s"
            for i in range(1, N + 1)
        ],
        N * 50,
        round(loss(N), 5),
    )


@log("speechbrain_epoch_summary.log", "https://github.com/speechbrain/speechbrain/issues/1452")
def _():
    return (
        [
            f"epoch: {i}, lr: 1.0e-04, steps: {i * 1000}, optimizer: Adam - train loss: "
            f"{loss(i):.2f} - valid loss: {loss(i) + 1:.2f}, valid ACC: 0.5"
            for i in range(1, N + 1)
        ],
        N * 1000,
        round(loss(N), 2),
    )


@log("markdown_quoted_nanogpt.log", "https://github.com/karpathy/nanoGPT/issues/254")
def _():
    return (
        [
            f"> iter {i * 10}: loss {loss(i):.4f}, time 1021.{i % 10}0ms, mfu 14.{i % 9}0%"
            for i in range(1, N + 1)
        ],
        N * 10,
        round(loss(N), 4),
    )


def main() -> None:
    OUT.mkdir(exist_ok=True)
    manifest = {}
    for name, (url, fn) in LOGS.items():
        lines, step, last = fn()
        (OUT / name).write_text("\n".join(lines) + "\n")
        manifest[name] = {"last_step": step, "last_loss": last, "source": url}
    (HERE / "metrics.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(len(manifest), "metrics logs")


if __name__ == "__main__":
    main()
