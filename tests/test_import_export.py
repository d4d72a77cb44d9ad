"""`tunedeck import` of real-world commands (blog flags included) and `tunedeck export`."""

from __future__ import annotations

import pytest

from conftest import REPO, cli
from tunedeck.core.estimate import batch
from tunedeck.core.backends.export import export
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.spec import load_spec
from tunedeck.core.backends.swift.version import installed_version

needs_swift = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")

# (command, expected spec values, words that must appear in the warnings)
TABLE = [
    (
        "NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift sft --model Qwen/Qwen2.5-7B-Instruct "
        "--train_type lora --dataset data.jsonl --lora_rank 8 --learning_rate 1e-4 "
        "--gradient_accumulation_steps 8 --max_steps 50",
        {
            "backend": "swift",
            "cluster.nproc_per_node": 2,
            "cluster.gpus": "0,1",
            "method.type": "lora",
            "train.grad_accum": 8,
            "train.max_steps": 50,
        },
        ["--tuner_type"],
    ),
    (
        "swift sft --model Qwen/Qwen2.5-7B --tuner_type qlora --dataset d.jsonl",
        {"method.type": "qlora", "method.quant_bits": 4},
        ["bnb"],
    ),
    (
        "swift sft --model m --dataset d.jsonl --sp_size 2 --deepspeed default-zero3",
        {"parallel.strategy": "deepspeed", "parallel.zero_stage": 3},
        ["--sequence_parallel_size", "zero3"],
    ),
    (
        "swift sft --model m --dataset d.jsonl --tuner_type lora --quant_method bnb --quant_bits 4 "
        "--deepspeed zero2_offload",
        {"method.type": "qlora", "parallel.zero_offload": "all"},
        [],
    ),
    (
        "NPROC_PER_NODE=8 megatron sft --model Qwen/Qwen2.5-72B --tp_size 4 --pp_size 2 "
        "--sequence_parallel true --micro_batch_size 1 --global_batch_size 16 --tuner_type lora "
        "--train_iters 100",
        {
            "swift.command": "megatron-sft",
            "parallel.tp": 4,
            "parallel.pp": 2,
            "parallel.sequence_parallel": True,
            "train.grad_accum": 16,
            "train.max_steps": 100,
        },
        ["--tensor_model_parallel_size", "--pipeline_model_parallel_size"],
    ),
    (
        "swift megatron sft --model m --dataset d.jsonl",
        {"swift.command": "megatron-sft"},
        ["megatron sft"],
    ),
    (
        "NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC_PER_NODE=4 swift rlhf --rlhf_type grpo "
        "--model m --dataset d.jsonl --use_vllm true --vllm_mode colocate --num_generations 8 "
        "--vllm_device auto",
        {
            "swift.rlhf_type": "grpo",
            "swift.use_vllm": True,
            "cluster.nnodes": 2,
            "cluster.master_addr": "10.0.0.1",
        },
        ["--vllm_device"],
    ),
    (
        "swift sft --model m --dataset d.jsonl --fsdp 'full_shard auto_wrap' --lora_r 16 "
        "--my_custom_flag 3",
        {"parallel.strategy": "fsdp2", "method.lora_rank": 16},
        ["fsdp2", "--lora_rank", "--my_custom_flag"],
    ),
    (
        "torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d "
        "--rdzv_endpoint=10.0.0.1:29400 train.py --lr 3e-4",
        {
            "backend": "script",
            "script.path": "train.py",
            "script.args": ["--lr", "3e-4"],
            "cluster.nnodes": 2,
            "cluster.master_port": 29400,
        },
        [],
    ),
    (
        "python -m torch.distributed.launch --nproc_per_node 2 -m mypkg.train --epochs 1",
        {"backend": "script", "script.module": "mypkg.train"},
        [],
    ),
    (
        "torchrun --nproc_per_node 2 swift/cli/sft.py --model m --dataset d.jsonl",
        {"backend": "swift", "swift.command": "sft"},
        [],
    ),
]


def _get(spec, key):
    obj = spec
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


@needs_swift
@pytest.mark.parametrize("command,expect,warn", TABLE, ids=[c[:40] for c, _, _ in TABLE])
def test_import_table_and_round_trip(command, expect, warn, model_cache):
    result = import_command(command)
    spec = result.spec()
    for key, value in expect.items():
        assert _get(spec, key) == value, key
    text = " ".join(result.warnings)
    for w in warn:
        assert w in text
    if "my_custom_flag" in command:  # unknown flags pass through, never dropped
        assert spec.swift.extra_args[-2:] == ["--my_custom_flag", "3"]
    # export -> import again: the same spec (the round trip keeps every field)
    resolved = resolve(spec, gpu_count=spec.cluster.nproc_per_node or 2)
    fmt = "swift" if spec.backend == "swift" else "nodes"
    if spec.backend == "swift" and "my_custom_flag" not in command:
        out = export(resolved, "swift")
        body = out.split("\n")
        env = [ln[len("export ") :] for ln in body if ln.startswith("export ")]
        cmd = " ".join(
            ln.rstrip(" \\") for ln in body if ln and not ln.startswith(("#", "export", "set"))
        )
        again = import_command(" ".join(env) + " " + cmd).spec()
        for key, value in expect.items():
            assert _get(again, key) == value, ("after export", key)
    elif spec.backend == "script":
        assert export(resolved, fmt)


def test_import_errors_are_clear():
    with pytest.raises(CommandImportError, match="no --model"):
        import_command("swift sft --dataset d.jsonl")
    with pytest.raises(CommandImportError, match="launcher"):
        import_command("horovodrun -np 2 train.py")
    with pytest.raises(CommandImportError, match=r"\$WORLD_SIZE"):
        import_command("NNODES=$WORLD_SIZE swift sft --model m")
    with pytest.raises(CommandImportError, match="NPROC_PER_NODE"):
        import_command("NPROC_PER_NODE=two swift sft --model m")


def test_effective_batch_and_rescale():
    spec = load_spec(REPO / "presets" / "swift-ddp-lora-2gpu.toml")
    assert batch.effective_batch(spec) == 1 * 2 * 8
    r = batch.rescale_grad_accum(spec, 4)
    assert r.spec.train.grad_accum == 4 and r.exact
    r = batch.rescale_grad_accum(spec, 3)
    assert not r.exact and "not a multiple" in r.note
    mg = load_spec(REPO / "presets" / "swift-megatron-lora-8xh100.toml")
    assert batch.data_parallel_size(mg) == 1 and batch.effective_batch(mg) == 16


@needs_swift
def test_export_formats(td_home):
    grpo = REPO / "presets" / "swift-grpo-vllm-2x4a100.toml"
    out = cli(
        "export", str(grpo), "--format", "slurm", "--set", "env.HF_TOKEN=hf_secret", home=td_home
    ).stdout
    assert "#SBATCH --nodes=2" in out and "scontrol show hostnames" in out
    assert '--node_rank "$SLURM_NODEID"' in out and "hf_secret" not in out
    out = cli("export", str(grpo), "--format", "nodes", home=td_home).stdout
    assert out.count("--node_rank") == 2
    out = cli("export", str(grpo), "--format", "swift", home=td_home).stdout
    assert "NNODES=2" in out and "swift \\\n  rlhf" in out
    out = cli(
        "export",
        str(REPO / "presets" / "swift-ddp-lora-2gpu.toml"),
        "--format",
        "vllm",
        home=td_home,
    ).stdout
    assert "--tensor-parallel-size 2" in out and "--enable-lora" in out
    proc = cli(
        "export",
        str(REPO / "presets" / "demo.toml"),
        "--format",
        "swift",
        home=td_home,
        check=False,
    )
    assert proc.returncode == 2 and "backend" in proc.stderr


def test_import_cli_writes_file(td_home, tmp_path):
    out = tmp_path / "imported.toml"
    proc = cli("import", "torchrun --nproc_per_node 2 train.py --x 1", "-o", str(out), home=td_home)
    assert load_spec(out).script.args == ["--x", "1"]
    assert "wrote" in proc.stderr
