"""Pasted ms-swift commands come back out as the user wrote them: one case per way they did
not (issue 14), each checked on the exported command and the dry-run's argv, through ms-swift's
own parser where it loads (tests/swift_roundtrip.py)."""

from __future__ import annotations

import json
import shlex
import tomllib

import pytest

from conftest import cli
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.backends.swift.version import installed_version
from tests.swift_roundtrip import parse_all, round_trip

pytestmark = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")


def _flags(argv: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = ""
    for w in argv:
        if w.startswith("--"):
            name, eq, v = w[2:].partition("=")
            out[name] = [v] if eq else []
        elif name:
            out[name].append(w)
    return out


def _trip(command: str):
    t = round_trip(command)
    assert not t.error, t.error
    return t


def test_datasets_stay_as_written_in_one_flag():
    t = _trip(
        "NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct --dataset "
        "'AI-ModelScope/alpaca-gpt4-data-zh#500' 'modelscope/coco_2014_caption:validation"
        "#20000' 'swift/self-cognition#500' ./data/local.jsonl"
    )
    want = [
        "AI-ModelScope/alpaca-gpt4-data-zh#500",
        "modelscope/coco_2014_caption:validation#20000",
        "swift/self-cognition#500",
        "./data/local.jsonl",
    ]
    for argv in (t.exported, t.dry_run):
        assert argv.count("--dataset") == 1
        assert _flags(argv)["dataset"] == want


def test_repeated_dataset_flags_keep_the_last_like_ms_swift():
    imp = import_command("swift sft --model m --dataset a#10 --dataset b c")
    assert imp.raw["data"]["datasets"] == ["b", "c"]
    assert any("more than once" in w and "--dataset" in w for w in imp.warnings)


def test_no_default_leaks_into_the_command():
    t = _trip(
        "NPROC_PER_NODE=4 swift sft --model Qwen/Qwen2.5-7B --tuner_type full "
        "--dataset d#100 --num_train_epochs 2 --logging_steps 5 "
        "--ddp_find_unused_parameters true"
    )
    for argv in (t.exported, t.dry_run):
        f = _flags(argv)
        for flag in (
            "max_steps",
            "max_length",
            "learning_rate",
            "weight_decay",
            "lora_dropout",
            "lora_alpha",
            "lora_rank",
            "truncation_strategy",
            "report_to",
            "attn_impl",
            "warmup_steps",
            "seed",
            "save_steps",
        ):
            assert flag not in f, (flag, argv)
        assert f["num_train_epochs"] == ["2"] and f["logging_steps"] == ["5"]
        assert f["ddp_find_unused_parameters"] == ["true"] and f["tuner_type"] == ["full"]


def test_megatron_full_stays_full_and_rlhf_imports():
    t = _trip(
        "NPROC_PER_NODE=8 megatron sft --model Qwen/Qwen2.5-7B --dataset d "
        "--tensor_model_parallel_size 2 --micro_batch_size 1 --global_batch_size 16 "
        "--train_iters 100 --lr 1e-5 --sequence_parallel true"
    )
    f = _flags(t.exported)
    assert "tuner_type" not in f and f["global_batch_size"] == ["16"]
    assert f["train_iters"] == ["100"] and f["lr"] == ["1e-05"]
    for rlhf_type in ("dpo", "kto", "grpo", "gkd"):
        t = _trip(
            f"NPROC_PER_NODE=8 megatron rlhf --rlhf_type {rlhf_type} --model m "
            "--dataset d --tuner_type lora"
        )
        assert t.swift_command == "megatron-rlhf"
        assert _flags(t.dry_run)["rlhf_type"] == [rlhf_type]


def test_valid_ms_swift_values_are_accepted_as_written():
    # sequence parallel with tp=1 (ms-swift turns it off), newer attention kernels, -1 limits
    t = _trip("NPROC_PER_NODE=2 megatron sft --model m --dataset d --sequence_parallel true")
    assert _flags(t.exported)["sequence_parallel"] == ["true"]
    for impl in ("flash_attention_3", "flash_attention_4", "flex_attention"):
        t = _trip(f"swift sft --model m --dataset d --attn_impl {impl} --save_total_limit -1")
        assert _flags(t.exported)["attn_impl"] == [impl]
        assert _flags(t.exported)["save_total_limit"] == ["-1"]
    parsed = parse_all([("sft", t.original or t.exported), ("sft", t.dry_run)])
    assert all(p["error"] is None and p["remaining"] == [] for p in parsed), parsed


def test_secrets_by_credential_names_only():
    imp = import_command(
        "IMAGE_MAX_TOKEN_NUM=1024 VIDEO_MAX_TOKEN_NUM=128 HF_TOKEN=hf_x "
        "swift sft --model m --dataset d --lazy_tokenize true "
        "--new_special_tokens '<a>' '<b>' --hub_token ms_secret"
    )
    assert imp.raw["env"] == {"IMAGE_MAX_TOKEN_NUM": "1024", "VIDEO_MAX_TOKEN_NUM": "128"}
    text = imp.to_toml()
    assert "hf_x" not in text and "ms_secret" not in text
    assert any("HF_TOKEN" in w for w in imp.warnings)
    assert any("--hub_token" in w for w in imp.warnings)
    t = _trip(
        shlex.join(
            [
                "swift",
                "sft",
                "--model",
                "m",
                "--lazy_tokenize",
                "true",
                "--new_special_tokens",
                "<a>",
                "<b>",
            ]
        )
    )
    for argv in (t.exported, t.dry_run):
        assert _flags(argv)["lazy_tokenize"] == ["true"]
        assert _flags(argv)["new_special_tokens"] == ["<a>", "<b>"]
    # a masked value from a tunedeck file is never fed back into a command
    imp = import_command("MY_API_KEY=**** swift sft --model m --swanlab_secret ****")
    assert "****" not in json.dumps(imp.raw)
    assert sum("****" in w for w in imp.warnings) >= 1


def test_launchers_keep_processes_and_nodes(tmp_path):
    t = _trip(
        "python -m torch.distributed.launch --nproc_per_node=2 --nnodes=1 -m swift sft "
        "--model m --dataset d"
    )
    assert t.swift_command == "sft" and t.procs == (2, 1)
    t = _trip(
        "CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --num_processes 8 "
        "--num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 "
        "--main_process_port 29500 swift/cli/sft.py --model m --dataset d#100"
    )
    assert t.procs == (4, 2) and _flags(t.exported)["dataset"] == ["d#100"]
    assert t.export_env["NNODES"] == "2" and t.export_env["MASTER_ADDR"] == "10.0.0.1"
    hosts = tmp_path / "host.txt"
    hosts.write_text("worker-0 slots=8\nworker-1 slots=8\n")
    t = _trip(
        f"deepspeed --hostfile={hosts} swift/cli/sft.py --model m --dataset d --deepspeed zero3"
    )
    assert t.procs == (8, 2) and t.export_env["MASTER_ADDR"] == "worker-0"
    assert _flags(t.exported)["deepspeed"] == ["zero3"]
    # NPROC_PER_NODE unset: the swift launcher runs one process
    t = _trip("CUDA_VISIBLE_DEVICES=0,1 swift sft --model m --dataset d")
    assert t.procs == (1, 1)


def test_config_files_are_read_as_ms_swift_does(tmp_path, monkeypatch):
    conf = tmp_path / "sft.yaml"
    conf.write_text(
        "model: Qwen/Qwen2.5-7B\ndataset:\n  - a#100\n  - b:train\n"
        "num_train_epochs: 2\nlora_rank: 16\nENV:\n  MAX_PIXELS: '1003520'\n"
    )
    monkeypatch.chdir(tmp_path)
    for command in (
        "NPROC_PER_NODE=2 swift sft sft.yaml --lora_rank 32",
        "NPROC_PER_NODE=2 swift sft --config sft.yaml --lora_rank 32",
    ):
        imp = import_command(command)
        assert imp.raw["data"]["datasets"] == ["a#100", "b:train"]
        assert imp.raw["method"]["lora_rank"] == 32  # the command line wins
        assert imp.raw["env"] == {"MAX_PIXELS": "1003520"}
    with pytest.raises(CommandImportError, match="missing.yaml"):
        import_command("swift sft missing.yaml")


def test_unexpanded_variables_are_refused_by_name():
    for command, var in (
        ("NNODES=$WORLD_SIZE NODE_RANK=$RANK swift sft --model m", "WORLD_SIZE"),
        ("swift sft --model ${MODEL_DIR}/x --dataset d", "MODEL_DIR"),
    ):
        with pytest.raises(CommandImportError, match=rf"\${var} is an unexpanded"):
            import_command(command)


def test_quantisation_is_kept_as_written():
    imp = import_command(
        "swift sft --model m --dataset d --tuner_type lora --quant_method awq --quant_bits 4"
    )
    assert imp.raw["swift"]["extra_args"] == ["--quant_method", "awq", "--quant_bits", "4"]
    assert "qlora" not in json.dumps(imp.raw) and not any("bnb" in w for w in imp.warnings)
    t = _trip("swift sft --model m --dataset d --quant_method bnb --quant_bits 4")
    assert _flags(t.exported)["quant_method"] == ["bnb"]
    assert "bnb_4bit_quant_type" not in _flags(t.exported)


def test_gkd_with_vllm_and_a_multiline_system_prompt_survive(td_home, tmp_path):
    system = "You are a helpful assistant.\nAnswer briefly.\n[env]\nLD_PRELOAD = '/x'"
    command = shlex.join(
        [
            "NPROC_PER_NODE=2",
            "swift",
            "rlhf",
            "--rlhf_type",
            "gkd",
            "--model",
            "m",
            "--teacher_model",
            "t",
            "--dataset",
            "d#10",
            "--use_vllm",
            "true",
            "--vllm_mode",
            "colocate",
            "--system",
            system,
        ]
    )
    spec_file = tmp_path / "gkd.toml"
    cli("import", command, "-o", str(spec_file), home=td_home)
    assert tomllib.loads(spec_file.read_text())["swift"]["extra_args"][-2:] == ["--system", system]
    out = cli("export", str(spec_file), "--format", "swift", home=td_home).stdout
    assert "gkd" in out and "--use_vllm true" in out
    proc = cli("launch", str(spec_file), "--dry-run", home=td_home, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(spec_file.read_text().replace('"colocate"', '"sideways"'))
    for args in (("launch", str(bad), "--dry-run"), ("export", str(bad), "--format", "swift")):
        proc = cli(*args, home=td_home, check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2 and "vllm_mode" in proc.stderr


def test_line_continuations_are_joined_as_the_shell_does():
    imp = import_command(
        "NPROC_PER_NODE=2 swift sft \\\n    --model m \\\n    --dataset a#5 \\\n"
        "    --system 'line one\nline two'"
    )
    assert imp.raw["data"]["datasets"] == ["a#5"]
    assert imp.raw["swift"]["extra_args"] == ["--system", "line one\nline two"]


def test_preview_names_each_value_and_where_it_comes_from():
    from tunedeck.core.preflight.preview import preview, settings_lines

    spec = import_command(
        "NPROC_PER_NODE=2 swift sft --model m --dataset d --lora_rank 16 "
        "--num_train_epochs 2 --warmup_ratio 0.1 --seed 7"
    ).spec()
    p = preview(spec)
    rows = {r["key"]: r for r in p.settings}
    assert rows["method.lora_rank"]["value"] == 16 and rows["method.lora_rank"]["source"] == "spec"
    assert rows["method.lora_alpha"]["source"].startswith("ms-swift ")
    assert rows["method.lora_alpha"]["value"] == 32  # ms-swift's default, not tunedeck's
    assert rows["train.max_steps"]["value"] == -1
    # what ms-swift works out at start where tunedeck can tell it: 16 / 1 per device / 2 ranks
    assert rows["train.grad_accum"]["value"] == 8
    assert rows["train.grad_accum"]["source"].endswith("a global batch of 16")
    assert "--seed 7  (train.seed: spec)" in settings_lines(p.settings)
    # the batch math and the length are those of the run ms-swift starts
    # (unset, ms-swift accumulates to a global batch of 16: 16 / 1 / 2 ranks)
    assert "1 per device x 2 data-parallel x 8 accumulation" in p.summary
    assert "2 epochs" in p.summary and "100 steps" not in p.summary
    mega = import_command(
        "NPROC_PER_NODE=8 megatron sft --model m --dataset d --tensor_model_parallel_size 2"
    ).spec()
    p = preview(mega)
    assert "full on m" in p.summary and "effective batch 16" in p.summary


def test_the_run_spec_file_launches_the_same_command(monkeypatch):
    """A launch freezes the resolved spec in spec.toml; clone and resume read it back: the
    same ms-swift argv, for every imported command of the scorer's corpus."""
    import sys
    from pathlib import Path

    from tunedeck.core.backends.swift import swift_args
    from tunedeck.core.estimate.resolve import resolve
    from tunedeck.core.spec import loads_spec

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from swift_import_score import CASES, read_cases

    monkeypatch.chdir(CASES.parent)
    seen = 0
    for case in read_cases(CASES):
        try:
            spec = import_command(case["text"]).spec()
        except CommandImportError as e:
            assert case.get("refuse") and case["refuse"] in str(e), (case["name"], str(e))
            continue
        resolved = resolve(spec, gpu_count=8)
        frozen = loads_spec(resolved.to_toml())
        assert swift_args(resolve(frozen, gpu_count=8), "/o") == swift_args(resolved, "/o"), case[
            "name"
        ]
        seen += 1
    assert seen >= 80
