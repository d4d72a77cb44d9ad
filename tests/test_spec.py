"""RunSpec loading, validation messages, --set overrides, secrets masking."""

from __future__ import annotations

import pytest

from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.spec import OPTIONS, RunSpec, SpecError, load_spec, loads_spec, mask_env
from tests.conftest import DEMO, cli


def test_demo_preset_loads_and_resolves_data_path():
    spec = load_spec(DEMO)
    assert spec.backend == "builtin"
    assert spec.method.type == "lora"
    assert spec.data.path.endswith("presets/data/demo_chat.jsonl")
    assert spec.train.max_steps <= 300


def test_unknown_key_names_key_and_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(
        'name = "x"\n[data]\npath = "d.jsonl"\n\n[train]\nmax_steps = 5\nlearnin_rate = 1\n'
    )
    with pytest.raises(SpecError) as e:
        load_spec(f)
    msg = str(e.value)
    assert f"{f}:7:" in msg and "train.learnin_rate" in msg
    assert "did you mean train.learning_rate" in msg


def test_wrong_type_names_key_and_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[data]\npath = "d.jsonl"\n[train]\nmax_steps = "ten"\n[cluster]\nnnodes = 0\n')
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert e.value.problems == [
        f"{f}:4: train.max_steps must be int, got str 'ten'",
        f"{f}:6: cluster.nnodes must be >= 1, got 0",
    ]


def test_bad_choice_and_toml_syntax(tmp_path):
    with pytest.raises(SpecError, match=r"<spec>:2: method.type must be one of full, lora, qlora"):
        loads_spec('[method]\ntype = "lorra"\n[data]\npath="x"\n')
    with pytest.raises(SpecError, match="not valid TOML.*line 1"):
        loads_spec("name = \n")


def test_set_overrides_typed_values_and_errors():
    spec = loads_spec(
        '[data]\npath = "x.jsonl"\n',
        overrides=[
            "train.learning_rate=3e-4",
            "train.max_steps=7",
            "model.path=/models/qwen",
            "env.NCCL_DEBUG=INFO",
            'method.target_modules=["q_proj","v_proj"]',
        ],
    )
    assert spec.train.learning_rate == 3e-4 and spec.train.max_steps == 7
    assert spec.model.path == "/models/qwen"
    assert spec.env == {"NCCL_DEBUG": "INFO"}
    assert spec.method.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(SpecError) as e:
        loads_spec('[data]\npath = "x"\n', overrides=["max_steps=3", "train.seed=x"])
    assert "--set max_steps: unknown key (did you mean train.max_steps?)" in e.value.problems
    assert "--set train.seed: train.seed must be int, got str 'x'" in e.value.problems


def test_roundtrip_through_toml():
    spec = load_spec(DEMO, ["env.HF_TOKEN=hf_secret"])
    again = loads_spec(spec.to_toml())
    assert again == spec


def test_every_option_has_help():
    assert all(o.help for o in OPTIONS.values()), [k for k, o in OPTIONS.items() if not o.help]


def test_secrets_are_masked_in_plans():
    assert mask_env({"HF_TOKEN": "abc", "NCCL_DEBUG": "INFO"}) == {
        "HF_TOKEN": "****",
        "NCCL_DEBUG": "INFO",
    }
    plan = LaunchPlan(
        "r", "builtin", 2, 1, [NodeCommand(0, "h", ["python"], {"WANDB_API_KEY": "k"}, "/")]
    )
    assert "k'" not in plan.to_shell() and "WANDB_API_KEY='****'" in plan.to_shell()
    assert plan.to_json()["nodes"][0]["env"]["WANDB_API_KEY"] == "****"


def test_resolve_picks_cpu_defaults_without_gpus():
    spec = resolve(RunSpec(), gpu_count=0)
    assert (spec.cluster.device, spec.cluster.nproc_per_node, spec.cluster.dist_backend) == (
        "cpu",
        2,
        "gloo",
    )
    assert spec.cluster.master_port > 0
    gpu = resolve(RunSpec(), gpu_count=8)
    assert (gpu.cluster.device, gpu.cluster.nproc_per_node, gpu.cluster.dist_backend) == (
        "cuda",
        8,
        "nccl",
    )


def test_broken_preset_launches_nothing(tmp_path, td_home):
    f = tmp_path / "broken.toml"
    f.write_text('name = "b"\n[data]\npath = "x.jsonl"\n[train]\nmax_step = 5\nseed = "one"\n')
    proc = cli("launch", str(f), home=td_home, check=False)
    assert proc.returncode == 2
    assert f"{f}:5: unknown key 'train.max_step'" in proc.stderr
    assert f"{f}:6: train.seed must be int" in proc.stderr
    assert not (td_home / "runs").exists() or not any((td_home / "runs").iterdir())


def test_secret_flags_are_masked_in_every_form():
    from tunedeck.core.spec import mask_argv

    argv = [
        "HF_TOKEN=abc",
        "swift",
        "sft",
        "--hub_token=tok1",
        "--hub_token",
        "tok2",
        "--model_author",
        "Ann",
        "--model",
        "m",
    ]
    assert mask_argv(argv) == [
        "HF_TOKEN=****",
        "swift",
        "sft",
        "--hub_token=****",
        "--hub_token",
        "****",
        "--model_author",
        "Ann",
        "--model",
        "m",
    ]
