"""The LLaMA-Factory backend: YAML import/export, the plan, trainer_log.jsonl → events, boot.py,
and (with a Python that has llamafactory: LLAMAFACTORY_PYTHON, docs/llamafactory.md) its real
argument parser and a tiny CPU run through `tunedeck launch`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml  # transformers' dependency, so the test environment has it

import lf_env
from conftest import REPO, cli, cli_json
from tunedeck.core.backends import BACKENDS, plan_run
from tunedeck.core.backends.llamafactory import BOOT, RESUME_VAR, restart
from tunedeck.core.backends.llamafactory import boot
from tunedeck.core.backends.llamafactory.config import to_config
from tunedeck.core.backends.llamafactory.monitor import TrainerLogMonitor, events_of
from tunedeck.core.backends.export import export
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.backends.llamafactory.yaml_io import export_form, from_yaml
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import loads_spec

CASES = Path(__file__).parent / "llamafactory_cases"
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
PLACEHOLDER = "/usr/bin/python3"  # named in plans that never run
BUILD = "TUNEDECK_TEST_BUILD_LLAMAFACTORY"


@pytest.fixture(scope="session")
def lf_python(tmp_path_factory) -> str:
    """A Python with LLaMA-Factory: LLAMAFACTORY_PYTHON, or one lf_env.py builds (with
    TUNEDECK_TEST_BUILD_LLAMAFACTORY=1, as .ci/run sets: 1-5 min once, then kept beside the
    session's temp folders, or in TUNEDECK_TEST_CACHE)."""
    given = os.environ.get("LLAMAFACTORY_PYTHON", "")
    if given:
        if not Path(given).is_file():
            pytest.skip(f"LLAMAFACTORY_PYTHON={given} is not a file")
        return given
    if os.environ.get(BUILD) != "1":
        pytest.skip(f"LLAMAFACTORY_PYTHON is unset; {BUILD}=1 builds one (tests/lf_env.py)")
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's is <the session's>/popen-gwN
        base = base.parent
    cache = Path(os.environ.get("TUNEDECK_TEST_CACHE") or base.parent)
    try:
        python, _ = lf_env.build(cache / "llamafactory-venv")
    except (lf_env.BuildError, OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot build LLaMA-Factory's venv: {e}")
    return str(python)


def _demo_spec(
    more: str = "", settings: str = '"report_to=none"', python: str = PLACEHOLDER
) -> str:
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
python = "{python}"
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
    back = yaml.safe_load(export_form(spec, spec.run.output_dir or None).files["x.yaml"])
    want = {k: v for k, v in original.items() if v is not None}
    assert back == want
    # and through the spec's TOML (what `tunedeck import` saves)
    again = loads_spec(spec.to_toml())
    assert yaml.safe_load(export_form(again, again.run.output_dir or None).files["x.yaml"]) == want


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


def test_import_a_pasted_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.yaml").write_text((CASES / "qwen_lora_sft.yaml").read_text())
    got = import_command(
        "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 "
        "llamafactory-cli train x.yaml learning_rate=2e-4 max_samples=50"
    )
    spec = got.spec()
    assert spec.name == "x" and spec.cluster.nproc_per_node == 4 and spec.cluster.gpus == "0,1,2,3"
    assert spec.train.learning_rate == 2e-4 and "FORCE_TORCHRUN" not in spec.env
    assert "max_samples=50" in spec.llamafactory.settings
    assert any("max_samples" in n and "llamafactory.settings" in n for n in got.notes)
    # LLaMA-Factory's argparse form (no file), its python -m and torchrun forms
    spec = import_command(
        "llamafactory-cli train --model_name_or_path m --stage dpo --do_train "
        "--dataset a,b --lora-rank 4 --report_to none"
    ).spec()
    assert (spec.model.path, spec.llamafactory.stage, spec.method.lora_rank) == ("m", "dpo", 4)
    assert spec.llamafactory.dataset == ["a", "b"] and spec.cluster.nproc_per_node == 0
    assert spec.llamafactory.settings == ["report_to=none"]
    for cmd in (
        "python -m llamafactory.cli train x.yaml",
        "torchrun -m llamafactory.launcher x.yaml",
    ):
        assert import_command(cmd).spec().model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    spec = import_command(
        "NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 lmf train x.yaml"
    ).spec()
    c = spec.cluster
    assert (c.nnodes, c.node_rank, c.master_addr, c.master_port) == (2, 1, "10.0.0.1", 29500)
    # a value the spec's key cannot hold stays as written, with a warning naming the key
    got = import_command("lmf train x.yaml lora_rank=many")
    assert "lora_rank=many" in got.spec().llamafactory.settings
    assert any(w.startswith("lora_rank:") for w in got.warnings)
    for cmd, said in (
        ("NPROC_PER_NODE=x lmf train x.yaml", "NPROC_PER_NODE='x'"),
        ("lmf train x.yaml --learning_rate 1", "--learning_rate: after a config file"),
        ("lmf chat x.yaml", "imports `lmf train`"),
        ("lmf train nothere.yaml", "nothere.yaml: cannot read it"),
        ("lmf train --stage sft", "no model_name_or_path"),
    ):
        with pytest.raises(CommandImportError, match=said):
            import_command(cmd)


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.glob("*.yaml")))
def test_import_export_import_is_the_same_spec(case, tmp_path, monkeypatch):
    """A pasted command → spec → `tunedeck export --format llamafactory` → the files and the
    command it writes → the same spec again."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / case).write_text((CASES / case).read_text())
    first = import_command(f"NPROC_PER_NODE=2 llamafactory-cli train {case}").spec()
    again = tmp_path / "again"
    command = _run_export(export(first, "llamafactory"), again)
    assert command[-3:] == ["llamafactory-cli", "train", case]
    monkeypatch.chdir(again)
    second = import_command(shlex.join(command)).spec()
    assert second.to_toml() == first.to_toml()


def _run_export(script: str, folder: Path) -> list[str]:
    """What the exported script does, without a shell: its files written into `folder`, and
    its command with the variables it exports in front."""
    folder.mkdir()
    for name, end, body in re.findall(r"cat > (\S+) <<'(\w+)'\n(.*?)\n\2\n", script, re.S):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(body + "\n")
    env = [
        shlex.split(line[len("export ") :])[0]
        for line in script.splitlines()
        if line.startswith("export ")
    ]
    last = script[script.rindex("\nexport ") :].split("\n", 2)[2]
    return env + shlex.split(last.replace("\\\n", " "))


def test_credentials_are_left_out():
    spec, warnings = from_yaml("model_name_or_path: m\ndataset: d\nhf_hub_token: hf_secret\n")
    assert not any("secret" in s for s in spec.llamafactory.settings)
    assert any("hf_hub_token" in w for w in warnings)


# -- plan and check ---------------------------------------------------------------------------


def test_plan_runs_boot_with_the_named_python_and_one_json_word(tmp_path):
    spec = resolve(loads_spec(_demo_spec()))
    spec, plan = plan_run(spec, RunDir(tmp_path), local=False)
    argv = plan.nodes[0].argv
    assert argv[0] == PLACEHOLDER
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
    assert got.note == "from checkpoint-2 (LLaMA-Factory's resume_from_checkpoint)"


def test_estimate_takes_llamafactorys_defaults():
    """Unset keys are LLaMA-Factory's (cutoff_len 2048, micro batch 8), not tunedeck's; a
    cutoff_len the config names is the spec's data.max_length and wins."""
    from tunedeck.core.backends.run_estimate import estimate_run

    est = estimate_run(resolve(loads_spec(_demo_spec())))  # it sets the micro batch: 2
    assert (est.spec.data.max_length, est.spec.train.per_device_batch_size) == (2048, 2)
    assert est.spec.train.grad_accum == 1
    assert (est.spec.method.lora_rank, est.spec.train.gradient_checkpointing) == (8, True)
    assert any("cutoff_len is 2048" in n for n in est.memory.notes)
    spec, _ = from_yaml("model_name_or_path: m\ndataset: d\ncutoff_len: 512\n")
    spec.data.path = str(DATA)
    spec.model.path = "builtin:tiny-qwen2"
    est = estimate_run(resolve(spec))
    assert (est.spec.data.max_length, est.spec.train.per_device_batch_size) == (512, 8)
    assert not any("cutoff_len" in n for n in est.memory.notes)


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


def test_real_argument_parser_takes_the_plan(tmp_path, model_cache, lf_python):
    from tunedeck.core.demo import ensure_tiny_model

    ensure_tiny_model(DATA)  # the model must exist for LLaMA-Factory's checks
    spec = resolve(loads_spec(_demo_spec("[method]\nlora_rank = 4\n", python=lf_python)))
    spec.train.learning_rate = 3e-4
    spec.explicit.add("train.learning_rate")
    spec, plan = plan_run(spec, RunDir(tmp_path))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [lf_python, "-c", PARSE, str(BOOT.parent), plan.nodes[0].argv[-1]],
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


def test_check_names_a_key_llamafactory_does_not_take(tmp_path, model_cache, lf_python):
    """Read from LLaMA-Factory's own parser dataclasses (a child of llamafactory.python, once,
    then cached)."""
    text = _demo_spec(settings='"report_to=none", "max_sample=5"', python=lf_python)
    spec = resolve(loads_spec(text))
    with pytest.raises(ValueError, match="max_sample is not a LLaMA-Factory key .did you mean"):
        plan_run(spec, RunDir(tmp_path))
    import importlib.util
    import sys

    if importlib.util.find_spec("llamafactory") is None:  # tunedeck's own Python: none there
        spec.llamafactory.python = sys.executable
        with pytest.raises(ValueError, match="has no llamafactory installed"):
            plan_run(spec, RunDir(tmp_path))


@pytest.mark.slow
def test_tiny_run_through_tunedeck_launch(td_home, tmp_path, lf_python):
    spec = tmp_path / "lf.toml"
    spec.write_text(_demo_spec(python=lf_python))
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


@pytest.mark.slow
def test_a_killed_rank_restarts_from_the_last_checkpoint(td_home, tmp_path, lf_python):
    """Rank 1 is killed once checkpoint-5 is written: the agent restarts torchrun with
    TUNEDECK_RESUME_FROM naming it, LLaMA-Factory resumes at global step 5, and the run
    ends with every step once in the metrics."""
    import signal
    import time

    from conftest import wait_for

    spec = tmp_path / "lf.toml"
    spec.write_text(
        _demo_spec("[run]\nmax_restarts = 1\nrestart_pause_s = 0.5\n", python=lf_python)
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
    assert "restarting in 0.5s from checkpoint-5 (LLaMA-Factory's resume_from_checkpoint)" in log
    ranks = "".join(
        p.read_text(errors="replace") for p in (run_dir / "logs").rglob("attempt_0/0/stderr.log")
    )
    assert "global step 5" in ranks  # the second torchrun's rank 0 resumed there
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == list(range(1, 41))


READ_EXPORT = """
import json, sys
from llamafactory.hparams.parser import get_train_args, read_args
from llamafactory.data.parser import get_dataset_list
cfg = read_args()  # the YAML as llamafactory-cli train reads it
cfg.pop("use_cpu", None); cfg.pop("ddp_backend", None)  # one process: no gloo group
m, d, t, f, g = get_train_args(cfg)
ds = get_dataset_list(d.dataset, d.dataset_dir)
print(json.dumps({"steps": t.max_steps, "rank": f.lora_rank, "cutoff": d.cutoff_len,
                  "model": m.model_name_or_path, "data": [x.dataset_name for x in ds]}))
"""


def test_real_parser_takes_the_export(tmp_path, model_cache, lf_python):
    """`tunedeck export --format llamafactory` of a spec with data.path: LLaMA-Factory's own
    reader and parser take the YAML, and its dataset_info.json names the data file."""
    from tunedeck.core.demo import ensure_tiny_model

    ensure_tiny_model(DATA)
    spec = resolve(loads_spec(_demo_spec("[method]\nlora_rank = 4\n")))
    command = _run_export(export(spec, "llamafactory"), tmp_path / "x")
    assert command[:2] == ["FORCE_TORCHRUN=1", "NPROC_PER_NODE=2"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [lf_python, "-c", READ_EXPORT, command[-1]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path / "x",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["steps"], got["rank"], got["cutoff"]) == (4, 4, 2048)
    assert got["data"] == [str(DATA)]  # dataset_info.json names the file
