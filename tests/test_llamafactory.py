"""The LLaMA-Factory backend: YAML import/export, the plan, trainer_log.jsonl → events, boot.py,
and (with a Python that has llamafactory: LLAMAFACTORY_PYTHON, docs/llamafactory.md) its real
argument parser and a tiny CPU run through `tunedeck launch`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml  # transformers' dependency, so the test environment has it

from conftest import REPO, cli, cli_json
from tunedeck.core.backends import BACKENDS, plan_run
from tunedeck.core.backends.llamafactory import BOOT, RESUME_VAR, restart
from tunedeck.core.backends.llamafactory import boot
from tunedeck.core.backends.llamafactory.config import to_config
from tunedeck.core.backends.llamafactory.monitor import TrainerLogMonitor, events_of
from tunedeck.core.backends.llamafactory.yaml_io import from_command, from_yaml, to_yaml
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import loads_spec

CASES = Path(__file__).parent / "llamafactory_cases"
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
LF_PYTHON = os.environ.get("LLAMAFACTORY_PYTHON", "")
needs_lf = pytest.mark.skipif(
    not (LF_PYTHON and Path(LF_PYTHON).is_file()),
    reason="LLAMAFACTORY_PYTHON does not name a Python with llamafactory installed "
    "(its own venv: docs/llamafactory.md)",
)


def _demo_spec(more: str = "", settings: str = '"report_to=none"') -> str:
    return f"""name = "lf"
backend = "llamafactory"
[data]
path = "{DATA}"
[train]
max_steps = 4
per_device_batch_size = 2
save_steps = 2
[cluster]
device = "cpu"
cpu_procs = 2
[llamafactory]
python = "{LF_PYTHON or "/usr/bin/python3"}"
settings = [{settings}]
{more}"""


# -- import / export ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.glob("*.yaml")))
def test_example_yaml_round_trip(case):
    """An example-shaped YAML → spec → YAML holds the same keys and values (a null
    resume_from_checkpoint, LLaMA-Factory's default, is left out)."""
    original = yaml.safe_load((CASES / case).read_text())
    spec, warnings = from_yaml((CASES / case).read_text(), "x")
    assert warnings == []
    assert spec.backend == "llamafactory"
    back = yaml.safe_load(to_yaml(spec))
    want = {k: v for k, v in original.items() if v is not None}
    assert back == want
    # and through the spec's TOML (what `tunedeck import` saves)
    again = loads_spec(spec.to_toml())
    assert yaml.safe_load(to_yaml(again)) == want


def test_import_maps_keys_onto_the_spec():
    spec, _ = from_yaml((CASES / "qwen_lora_sft.yaml").read_text())
    assert spec.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (spec.method.type, spec.method.lora_rank) == ("lora", 16)
    assert spec.method.target_modules == ["all-linear"]
    assert spec.train.grad_accum == 8 and spec.train.num_epochs == 3.0
    assert spec.model.dtype == "bfloat16" and spec.data.max_length == 2048
    assert spec.llamafactory.dataset == ["identity", "alpaca_en_demo"]
    assert "max_samples=1000" in spec.llamafactory.settings
    spec, _ = from_yaml((CASES / "qlora_dpo.yaml").read_text())
    assert (spec.method.type, spec.method.quant_bits, spec.llamafactory.stage) == (
        "qlora",
        4,
        "dpo",
    )
    assert spec.method.target_modules == ["q_proj", "v_proj"]


def test_import_a_pasted_command(tmp_path):
    (tmp_path / "x.yaml").write_text((CASES / "qwen_lora_sft.yaml").read_text())
    spec, _ = from_command(
        "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 "
        "llamafactory-cli train x.yaml learning_rate=2e-4 max_samples=50",
        cwd=tmp_path,
    )
    assert spec.name == "x" and spec.cluster.nproc_per_node == 4 and spec.cluster.gpus == "0,1,2,3"
    assert spec.train.learning_rate == 2e-4
    assert "max_samples=50" in spec.llamafactory.settings
    with pytest.raises(ValueError, match="llamafactory-cli train"):
        from_command("swift sft --model x")
    with pytest.raises(ValueError, match="NPROC_PER_NODE=x"):
        from_command("NPROC_PER_NODE=x lmf train x.yaml", cwd=tmp_path)
    with pytest.raises(ValueError, match="key=value"):
        from_command("lmf train x.yaml --learning_rate 1", cwd=tmp_path)
    spec, _ = from_command(
        "NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 lmf train x.yaml",
        cwd=tmp_path,
    )
    c = spec.cluster
    assert (c.nnodes, c.node_rank, c.master_addr, c.master_port) == (2, 1, "10.0.0.1", 29500)


def test_credentials_are_left_out():
    spec, warnings = from_yaml("model_name_or_path: m\ndataset: d\nhf_hub_token: hf_secret\n")
    assert not any("secret" in s for s in spec.llamafactory.settings)
    assert any("hf_hub_token" in w for w in warnings)


# -- plan and check ---------------------------------------------------------------------------


def test_plan_runs_boot_with_the_named_python_and_one_json_word(tmp_path):
    spec = resolve(loads_spec(_demo_spec()))
    spec, plan = plan_run(spec, RunDir(tmp_path), local=False)
    argv = plan.nodes[0].argv
    assert argv[0] == (LF_PYTHON or "/usr/bin/python3")
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[-2] == str(BOOT)
    cfg = json.loads(argv[-1])
    assert cfg["stage"] == "sft" and cfg["max_steps"] == 4 and cfg["save_steps"] == 2
    assert cfg["use_cpu"] is True and cfg["ddp_backend"] == "gloo"
    assert cfg["template"] == "qwen" and cfg["report_to"] == "none"
    assert cfg["dataset"] == "tunedeck_data"
    assert cfg["tunedeck_dataset_dir"] == str(tmp_path / "llamafactory")
    entry = cfg["tunedeck_dataset_info"]["tunedeck_data"]
    assert entry["formatting"] == "sharegpt" and entry["file_name"] == str(DATA)
    assert cfg["output_dir"] == str(RunDir(tmp_path).output_dir(spec))
    assert "learning_rate" not in cfg  # not set: LLaMA-Factory's default
    assert plan.nodes[0].env["HF_HUB_OFFLINE"] == "1"  # the built-in model is local
    assert not (tmp_path / "llamafactory").exists()  # the plan wrote nothing


@pytest.mark.parametrize(
    ("more", "settings", "names"),
    [
        ("", '"stage=dpo"', "llamafactory.settings: stage"),
        ("", '"learning_rate=1"', "train.learning_rate"),
        ("", '"hf_hub_token=x"', "credential"),
        ("", '"oops"', "not key=value"),
        ("[train.compile]\n", "", None),
        ('[parallel]\nstrategy = "fsdp2"\n', "", "parallel.strategy fsdp2"),
        ('dataset = ["alpaca_en_demo"]\n', "", "llamafactory.dataset_dir"),
    ],
)
def test_check_names_the_bad_field(tmp_path, more, settings, names):
    if more.startswith("[train.compile]"):
        text = _demo_spec(settings=settings).replace(
            "save_steps = 2\n", "save_steps = 2\ncompile = false\n"
        )
        names = "train.compile"
    else:
        text = _demo_spec(more, settings)
    spec = resolve(loads_spec(text))
    with pytest.raises(ValueError, match=names):
        plan_run(spec, RunDir(tmp_path), local=False)


@pytest.mark.parametrize("model", ["builtin:tiny-qwen2", "/models/m"])
def test_a_missing_data_file_is_named(tmp_path, model):
    text = _demo_spec().replace(str(DATA), str(tmp_path / "none.jsonl"))
    text = text.replace("[data]", f'[model]\npath = "{model}"\n[data]')
    with pytest.raises(ValueError, match="data.path"):
        plan_run(resolve(loads_spec(text)), RunDir(tmp_path), local=False)


def test_registered():
    assert "llamafactory" in BACKENDS


# -- boot.py and restarts ---------------------------------------------------------------------


def test_boot_writes_dataset_info_and_takes_the_restart_checkpoint(tmp_path, monkeypatch):
    spec = resolve(loads_spec(_demo_spec()))
    cfg = to_config(spec, str(tmp_path / "out"), tmp_path)
    monkeypatch.setenv(RESUME_VAR, "/ck/checkpoint-2")
    got = boot.prepare(json.loads(json.dumps(cfg)))
    assert not any(k.startswith("tunedeck_") for k in got)
    assert got["dataset_dir"] == str(tmp_path / "llamafactory")
    info = json.loads((tmp_path / "llamafactory" / "dataset_info.json").read_text())
    assert info["tunedeck_data"]["file_name"] == str(DATA)
    assert got["resume_from_checkpoint"] == "/ck/checkpoint-2"
    assert "overwrite_output_dir" not in got
    # a restart with nothing to resume from starts over in the folder the first attempt used
    monkeypatch.delenv(RESUME_VAR)
    monkeypatch.setenv("TUNEDECK_ATTEMPT", "1")
    again = boot.prepare(json.loads(json.dumps(cfg)))
    assert again["overwrite_output_dir"] is True and "resume_from_checkpoint" not in again


def test_restart_names_the_newest_checkpoint(tmp_path):
    spec = resolve(loads_spec(_demo_spec()))
    run = RunDir(tmp_path)
    out = run.output_dir(spec)
    assert restart(spec, run, 1).checkpoint is None
    ck = out / "checkpoint-2"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    (ck / "adapter_model.safetensors").write_text("x")
    got = restart(spec, run, 1)  # complete: it holds trainer_state.json
    assert got.checkpoint == ck and got.step == 2 and got.environ() == {RESUME_VAR: str(ck)}


# -- trainer_log.jsonl → events -------------------------------------------------------------

LOG = [
    {"current_steps": 1, "total_steps": 4, "loss": 7.75, "lr": 0.0, "epoch": 0.016},
    {"current_steps": 2, "total_steps": 4, "loss": 7.48, "lr": 1e-3, "epoch": 0.03},
    {"current_steps": 2, "total_steps": 4, "eval_loss": 7.4, "epoch": 0.03},
    {"current_steps": 3, "total_steps": 4, "loss": 7.5, "lr": 9e-4, "throughput": 812.5},
    {"current_steps": 4, "total_steps": 4, "loss": 7.3, "lr": 5e-4, "epoch": 0.06},
    {"current_steps": 4, "total_steps": 4, "epoch": 0.06, "percentage": 100.0},
]


def test_trainer_log_line_to_events():
    assert events_of(LOG[0]) == [
        {"kind": "step", "step": 1, "loss": 7.75, "lr": 0.0, "epoch": 0.016}
    ]
    assert events_of(LOG[2]) == [{"kind": "eval", "step": 2, "eval_loss": 7.4}]
    assert events_of(LOG[3])[0]["tokens_per_s"] == 812.5
    assert events_of(LOG[5]) == [] and events_of({"current_steps": "x", "loss": 1}) == []


def test_monitor_tails_the_log_and_ends_the_run(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    m = TrainerLogMonitor(RunDir(tmp_path), out)
    m.tick(0, [])  # no file yet: nothing to read
    log = out / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in LOG[:3]))
    m.tick(0, [])
    with log.open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in LOG[3:]) + '{"current_steps": 5, "lo')
    m.close([])
    ev = [json.loads(x) for x in (tmp_path / "events" / "rank0.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in ev] == [
        ("step", 1),
        ("step", 2),
        ("eval", 2),
        ("step", 3),
        ("step", 4),
        ("end", 4),
    ]


def test_monitor_restart_replaces_repeated_steps(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    m = TrainerLogMonitor(RunDir(tmp_path), out)
    log = out / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in LOG[:4]))
    m.tick(0, [])
    m.restarted(2)  # resumed from checkpoint-2: LLaMA-Factory appends steps 3, 4 again
    with log.open("a") as f:
        f.write(json.dumps({"current_steps": 3, "total_steps": 4, "loss": 6.0}) + "\n")
    m.close([])
    ev = [json.loads(x) for x in (tmp_path / "events" / "rank0.jsonl").read_text().splitlines()]
    assert [(e["step"], e.get("loss")) for e in ev if e["kind"] == "step"][-1] == (3, 6.0)


# -- the real LLaMA-Factory -----------------------------------------------------------------

PARSE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import boot
cfg = boot.prepare(json.loads(sys.argv[2]))
cfg.pop("use_cpu", None); cfg.pop("ddp_backend", None)  # one process: no gloo group
from llamafactory.hparams import get_train_args
m, d, t, f, g = get_train_args(cfg)
print(json.dumps({"stage": f.stage, "rank": f.lora_rank, "steps": t.max_steps,
                  "cutoff": d.cutoff_len, "dataset": d.dataset, "lr": t.learning_rate}))
"""


@needs_lf
def test_real_argument_parser_takes_the_plan(tmp_path, model_cache):
    from tunedeck.core.demo import ensure_tiny_model

    ensure_tiny_model(DATA)  # the model must exist for LLaMA-Factory's checks
    spec = resolve(loads_spec(_demo_spec("[method]\nlora_rank = 4\n")))
    spec.train.learning_rate = 3e-4
    spec.explicit.add("train.learning_rate")
    spec, plan = plan_run(spec, RunDir(tmp_path))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [LF_PYTHON, "-c", PARSE, str(BOOT.parent), plan.nodes[0].argv[-1]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "stage": "sft",
        "rank": 4,
        "steps": 4,
        "cutoff": 2048,
        "dataset": ["tunedeck_data"],
        "lr": 3e-4,
    }


@needs_lf
def test_check_names_a_key_llamafactory_does_not_take(tmp_path, model_cache):
    """Read from LLaMA-Factory's own parser dataclasses (a child of llamafactory.python, once,
    then cached)."""
    spec = resolve(loads_spec(_demo_spec(settings='"report_to=none", "max_sample=5"')))
    with pytest.raises(ValueError, match="max_sample is not a LLaMA-Factory key .did you mean"):
        plan_run(spec, RunDir(tmp_path))
    import importlib.util
    import sys

    if importlib.util.find_spec("llamafactory") is None:  # tunedeck's own Python: none there
        spec.llamafactory.python = sys.executable
        with pytest.raises(ValueError, match="has no llamafactory installed"):
            plan_run(spec, RunDir(tmp_path))


@needs_lf
@pytest.mark.slow
def test_tiny_run_through_tunedeck_launch(td_home, tmp_path):
    spec = tmp_path / "lf.toml"
    spec.write_text(_demo_spec())
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=500)
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    run_dir = td_home / "runs" / run_id
    assert proc.returncode == 0, (run_dir / "logs" / "agent.log").read_text()[-3000:]
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in recs)
    out = run_dir / "output"
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert (out / "checkpoint-4" / "adapter_model.safetensors").is_file()


@needs_lf
@pytest.mark.slow
def test_a_killed_rank_restarts_from_the_last_checkpoint(td_home, tmp_path):
    """Rank 1 is killed once checkpoint-5 is written: the agent restarts torchrun with
    TUNEDECK_RESUME_FROM naming it, LLaMA-Factory resumes at global step 5, and the run
    ends with every step once in the metrics."""
    import signal
    import time

    from conftest import wait_for

    spec = tmp_path / "lf.toml"
    spec.write_text(
        _demo_spec("[run]\nmax_restarts = 1\nrestart_pause_s = 0.5\n")
        .replace("max_steps = 4", "max_steps = 40")
        .replace("save_steps = 2", "save_steps = 5")
    )
    run_id = cli_json("launch", str(spec), home=td_home)["run_id"]
    run_dir = td_home / "runs" / run_id
    ck = run_dir / "output" / "checkpoint-5" / "trainer_state.json"
    wait_for(ck.is_file, 400, "checkpoint-5")
    pid = json.loads((run_dir / "state.json").read_text())["rank_pids"]["1"]
    os.kill(pid, signal.SIGKILL)

    def ended():
        st = json.loads((run_dir / "state.json").read_text())
        return st if st["status"] in ("succeeded", "failed", "stopped") else None

    st = wait_for(ended, 500, "the run's end")
    time.sleep(0.5)
    log = (run_dir / "logs" / "agent.log").read_text()
    assert st["status"] == "succeeded", log[-3000:]
    assert "restarting in 0.5s from checkpoint-5" in log
    ranks = "".join(
        p.read_text(errors="replace") for p in (run_dir / "logs").rglob("attempt_0/0/stderr.log")
    )
    assert "global step 5" in ranks  # the second torchrun's rank 0 resumed there
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == list(range(1, 41))
