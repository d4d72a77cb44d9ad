"""The script backend: a user's HF Trainer script under tunedeck's torchrun, its console
parsed into step events."""

from __future__ import annotations

import ast
import json
import re

import pytest

from conftest import REPO, cli, cli_json
from tunedeck.core.backends import plan_run
from tunedeck.core.backends.script import ConsoleMonitor
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import loads_spec

HF_OUT = """\
  0%|          | 0/3 [00:00<?, ?it/s] 33%|###3      | 1/3 [00:00<00:00,  5.91it/s]\
   {'loss': '7.602', 'grad_norm': '1.835', 'learning_rate': '0.005', 'epoch': '0.01639'}
{'loss': '7.175', 'grad_norm': '1.622', 'learning_rate': '0.003333', 'epoch': '0.03279'}
{'eval_loss': '7.1', 'epoch': '0.03'}
{'train_runtime': '0.5165', 'train_loss': '7.33', 'epoch': '0.04918'}
"""


def _read(run_dir):
    return [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").read_text().splitlines()]


def test_console_parsing(tmp_path):
    m = ConsoleMonitor(RunDir(tmp_path), 0, logging_steps=5)
    m.parse(HF_OUT.replace("\r", "\n").splitlines())
    ev = _read(tmp_path)
    steps = [e for e in ev if e["kind"] == "step"]
    assert [(e["step"], e["loss"]) for e in steps] == [(5, 7.602), (10, 7.175)]
    assert steps[1]["lr"] == pytest.approx(0.003333) and steps[0]["grad_norm"] == 1.835
    assert [(e["step"], e["eval_loss"]) for e in ev if e["kind"] == "eval"] == [(10, 7.1)]


def test_tqdm_only_script(tmp_path):
    m = ConsoleMonitor(RunDir(tmp_path))
    m.parse(
        [
            "Loading weights: 100%|##########| 50/50 [00:00<00:00, 6347.89it/s]",
            "epoch 0:  40%|####      | 4/10 [00:02<00:03,  2.00it/s, loss=1.25]",
            "epoch 0:  50%|#####     | 5/10 [00:02<00:03,  2.00it/s, loss=1.2]",
        ]
    )
    ev = _read(tmp_path)
    assert [(e["step"], e["loss"], e["step_s"]) for e in ev] == [(4, 1.25, 0.5), (5, 1.2, 0.5)]


def test_plan_runs_script_or_module(tmp_path):
    spec = resolve(
        loads_spec(
            'backend = "script"\n[script]\nmodule = "pkg.train"\n'
            'args = ["--x", "1"]\n[cluster]\ndevice = "cpu"\n'
        )
    )
    argv = plan_run(spec, RunDir(tmp_path))[1].nodes[0].argv
    assert argv[:3][1:] == ["-m", "torch.distributed.run"] and argv[-4:] == [
        "-m",
        "pkg.train",
        "--x",
        "1",
    ]
    spec = resolve(loads_spec('backend = "script"\n[script]\npath = "/nonexistent.py"\n'))
    with pytest.raises(ValueError, match="script.path"):
        plan_run(spec, RunDir(tmp_path))
    # an export for another machine does not need the script here
    assert plan_run(spec, RunDir(tmp_path), local=False)[1].nodes[0].argv[-1] == "/nonexistent.py"


def _hf_script_spec(tmp_path, name: str, args: str, more: str = ""):
    """tests/scripts/hf_trainer_script.py on 2 CPU processes, logging every step."""
    script = REPO / "tests" / "scripts" / "hf_trainer_script.py"
    data = REPO / "presets" / "data" / "demo_chat.jsonl"
    spec = tmp_path / "script.toml"
    spec.write_text(f"""name = "{name}"
backend = "script"
[script]
path = "{script}"
args = [{args}, "--logging_steps", "1", "--data", "{data}"]
[data]
# the agent prepares the (default) built-in model from it; the script then finds it cached
path = "{data}"
[cluster]
device = "cpu"
cpu_procs = 2
{more}""")
    return spec


@pytest.mark.slow
def test_hf_trainer_script_loss_in_metrics(td_home, tmp_path):
    spec = _hf_script_spec(tmp_path, "hf-script", '"--max_steps", "3"')
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=400)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["loss"] > 0 for r in recs)


@pytest.mark.slow
def test_restarted_script_is_told_its_last_checkpoint(td_home, tmp_path):
    """An HF Trainer script whose rank 1 dies at step 7 of the first attempt (steps 1-6
    logged, checkpoint-4 written): the restart gets TUNEDECK_RESUME_FROM naming it, the script
    hands it to trainer.train and logs steps 5-8 again, which the metrics number 5-8 (HF's
    dicts carry no step) and keep in place of the first attempt's 5 and 6."""
    spec = _hf_script_spec(
        tmp_path,
        "hf-restart",
        '"--max_steps", "8", "--save_steps", "4", "--crash_at_step", "7"',
        "[run]\nmax_restarts = 1\nrestart_pause_s = 0.5\n",
    )
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=400)
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    run_dir = td_home / "runs" / run_id
    log = (run_dir / "logs" / "agent.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert "restarting in 0.5s from checkpoint-4 (TUNEDECK_RESUME_FROM for the script)" in log
    state = json.loads((run_dir / "state.json").read_text())
    assert [a["exit_code"] != 0 for a in state["attempts"]] == [True, False], state
    # the second attempt logged steps 5-8 only (a fresh start logs 8 losses)
    said = "".join(p.read_text(errors="replace") for p in RunDir(run_dir).rank_log_files(0))
    second = [float(d["loss"]) for d in map(ast.literal_eval, re.findall(r"\{'loss'.*?\}", said))]
    assert len(second) == 4, said[-2000:]
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == list(range(1, 9))
    assert [r["loss"] for r in recs[4:]] == pytest.approx(second, rel=1e-3)


@pytest.mark.slow
def test_resume_and_clone_from_the_command_line(td_home, tmp_path):
    """A script run fails at step 5 with checkpoint-4 written. `tunedeck resume` (the script's
    args changed with --set) tells the new run TUNEDECK_RESUME_FROM, and its metrics go on at
    step 5; `tunedeck clone` starts from step 0."""
    data = REPO / "presets" / "data" / "demo_chat.jsonl"
    spec = _hf_script_spec(
        tmp_path, "hf-resume", '"--max_steps", "6", "--save_steps", "4", "--crash_at_step", "5"'
    )
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=400)
    first = json.loads(proc.stdout.splitlines()[0])["run_id"]
    assert proc.returncode == 1 and cli_json("status", first, home=td_home)["status"] == "failed"
    args = (
        f'script.args=["--max_steps", "6", "--logging_steps", "1", "--save_steps", "4", '
        f'"--data", "{data}"]'
    )
    proc = cli(
        "resume", first, "--set", args, "--wait", "--json", home=td_home, check=False, timeout=400
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[0])
    assert out["from"] == first and out["checkpoint"].endswith("checkpoint-4"), out
    assert "TUNEDECK_RESUME_FROM" in proc.stderr and "reads it" in proc.stderr, proc.stderr
    assert [r["step"] for r in cli_json("metrics", out["run_id"], home=td_home)] == [5, 6]
    proc = cli(
        "clone",
        first,
        "--set",
        args,
        "--set",
        "script.args=[]",
        "--no-preflight",
        "--json",
        home=td_home,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    clone = json.loads(proc.stdout.splitlines()[0])
    assert clone["checkpoint"] is None and clone["run_id"] not in (first, out["run_id"])
    cli("stop", clone["run_id"], "--hard", "--wait", home=td_home, check=False)
    runs = len(cli_json("ls", home=td_home))
    bad = cli("resume", first, "--set", "train.nope=1", home=td_home, check=False)
    assert bad.returncode == 2 and "train.nope" in bad.stderr, bad.stderr
    assert len(cli_json("ls", home=td_home)) == runs  # nothing launched


def test_console_nan_loss_is_kept_and_written_as_json_null(tmp_path):
    # transformers 4 prints a bare nan (which Python's literal_eval rejects), after a bar
    m = ConsoleMonitor(RunDir(tmp_path))
    m.parse(["Train: 5%|█| 5/100 [00:01<00:19]\r{'loss': nan, 'grad_norm': 1.5}"])
    [line] = (tmp_path / "events" / "rank0.jsonl").read_text().splitlines()
    ev = json.loads(line)  # strict JSON, no bare NaN
    assert ev["kind"] == "step" and ev["loss"] is None and ev["grad_norm"] == 1.5


def test_console_counts_from_the_step_a_restart_resumed_after(tmp_path):
    """HF dicts carry no step: after a restart from checkpoint-4 the first one is step 5, both
    for the agent that restarted the attempt and for one adopting it later (the launch's
    from_step in state.json); the first attempt's 5 and 6 are replaced, not kept."""
    run = RunDir(tmp_path)
    dicts = ["{'loss': '%s', 'learning_rate': '0.001'}" % x for x in (9, 8, 7, 6, 5, 4)]
    m = ConsoleMonitor(run)
    m.parse(dicts)
    m.restarted(4)
    m.parse(
        ["{'loss': '1.5', 'learning_rate': '0.001'}", "{'loss': '1.25', 'learning_rate': '0.001'}"]
    )
    assert [(e["step"], e["loss"]) for e in _read(tmp_path)][-2:] == [(5, 1.5), (6, 1.25)]
    run.write_state({"launches": [{"attempt": 0}, {"attempt": 1, "from_step": 4}]})
    adopter = ConsoleMonitor(run, 0, 2)
    adopter.parse(dicts[:2])
    assert [e["step"] for e in _read(tmp_path)][-2:] == [6, 8]


def test_plain_step_prints_and_repeated_steps(tmp_path):
    m = ConsoleMonitor(RunDir(tmp_path))
    m.parse(["epoch 0 step 1 loss 2.5", "Step: 2 | Loss: 2.25", "step=2, loss=2.25"])
    assert [(e["step"], e["loss"]) for e in _read(tmp_path)] == [(1, 2.5), (2, 2.25)]
