"""The ms-swift backend: flags per version, refusal of flags that do not exist, every swift
preset accepted by the installed ms-swift's own argument parser, and a real CPU run."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from conftest import REPO, cli, cli_json
from tunedeck.core.backends import plan_run
from tunedeck.core.backends.swift import SwiftPlanError, swift_args
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import load_spec, loads_spec
from tunedeck.core.backends.swift import flags
from tunedeck.core.backends.swift.version import installed_version

PRESETS = sorted((REPO / "presets").glob("*.toml"))
SWIFT_PRESETS = [p for p in PRESETS if load_spec(p).backend == "swift"]
needs_swift = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")


def _spec(extra: str = "", **kw):
    text = 'backend = "swift"\n[model]\npath = "Qwen/Qwen2.5-0.5B"\n[data]\npath = "d.jsonl"\n'
    spec = loads_spec(text + extra, source="<test>")
    return resolve(spec, gpu_count=kw.get("gpus", 2))


def test_every_preset_loads():
    assert len(PRESETS) >= 10
    for p in PRESETS:
        load_spec(p)  # raises SpecError naming file:line


def test_flags_follow_the_spec():
    a = swift_args(
        _spec('[parallel]\nstrategy = "deepspeed"\nzero_stage = 3\nzero_offload = "all"\n'), "/o"
    )
    assert a[a.index("--deepspeed") + 1] == "zero3_offload"
    a = swift_args(_spec('[method]\ntype = "qlora"\n'), "/o")
    assert "--bnb_4bit_quant_type" not in a  # ms-swift's defaults (nf4, double quant)
    assert a[a.index("--tuner_type") + 1] == "lora"
    assert a[a.index("--quant_method") + 1] == "bnb" and a[a.index("--quant_bits") + 1] == "4"
    a = swift_args(_spec('[parallel]\nstrategy = "fsdp2"\n'), "/o")
    assert a[a.index("--fsdp") + 1] == "fsdp2" and "--ddp_find_unused_parameters" not in a
    a = swift_args(_spec(), "/o")  # DDP LoRA on 2 GPUs: only what the spec sets
    assert a == ["--model", "Qwen/Qwen2.5-0.5B", "--dataset", "d.jsonl", "--output_dir", "/o"]
    a = swift_args(
        _spec(
            '[parallel]\nstrategy = "megatron"\ntp = 2\nsequence_parallel = true\n'
            '[swift]\ncommand = "megatron-sft"\n[train]\ngrad_accum = 4\n'
            "per_device_batch_size = 2\n",
            gpus=8,
        ),
        "/o",
    )
    assert a[a.index("--tensor_model_parallel_size") + 1] == "2"
    assert a[a.index("--sequence_parallel") + 1] == "true"
    assert a[a.index("--global_batch_size") + 1] == str(2 * 4 * 4)  # micro x dp(8/2) x accum
    a = swift_args(
        _spec(
            '[swift]\ncommand = "rlhf"\nrlhf_type = "grpo"\nuse_vllm = true\nvllm_mode = "server"\n'
        ),
        "/o",
    )
    assert a[a.index("--vllm_mode") + 1] == "server" and a[a.index("--use_vllm") + 1] == "true"
    # ms-swift 3.x took --train_type
    assert "--train_type" in swift_args(_spec('[method]\ntype = "full"\n'), "/o", version="3.12.6")
    # a finite collective timeout reaches ms-swift (its default is 208 days)
    a = swift_args(_spec("[cluster]\ncollective_timeout_s = 1800\n"), "/o")
    assert a[a.index("--ddp_timeout") + 1] == "1800"
    assert "--ddp_timeout" not in swift_args(_spec(), "/o")
    with pytest.raises(SwiftPlanError, match="zero_stage"):
        swift_args(
            _spec('[parallel]\nstrategy = "deepspeed"\nzero_stage = 1\nzero_offload = "all"\n'),
            "/o",
        )


@needs_swift
def test_resume_from_auto_names_a_folder_for_ms_swift(tmp_path):
    """ms-swift takes a folder, never "auto": the newest complete checkpoint in the output
    folder (its version folders too), or no flag when there is none yet."""
    spec = _spec('[train]\nresume_from = "auto"\n')
    assert "--resume_from_checkpoint" not in swift_args(spec, str(tmp_path))
    ck = tmp_path / "v0-20260101-000000" / "checkpoint-6"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    a = swift_args(spec, str(tmp_path))
    assert a[a.index("--resume_from_checkpoint") + 1] == str(ck)
    a = swift_args(_spec('[train]\nresume_from = "/ck/checkpoint-2"\n'), str(tmp_path))
    assert a[a.index("--resume_from_checkpoint") + 1] == "/ck/checkpoint-2"


def test_a_restart_passes_a_checkpoint_only_where_ms_swift_takes_one(tmp_path):
    """sft: the last checkpoint written, as --resume_from_checkpoint (on several nodes the
    head's reading, core/supervisor/restarts). Megatron has no such flag: step 0, and the note says
    how it resumes."""
    from tunedeck.core.backends.swift import restart

    out = tmp_path / "out"
    ck = out / "v0-20260101-000000" / "checkpoint-6"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    run = RunDir(tmp_path / "run")
    one = _spec(f'[run]\noutput_dir = "{out}"\n')
    r = restart(one, run, 1)
    assert r.checkpoint == ck and r.argv(["-m", "swift.cli.sft"])[-2:] == [
        "--resume_from_checkpoint",
        str(ck),
    ]
    assert restart(one, run, 0).checkpoint is None  # the first attempt: train.resume_from
    mega = _spec(
        f'[run]\noutput_dir = "{out}"\n[parallel]\nstrategy = "megatron"\n'
        '[swift]\ncommand = "megatron-sft"\n'
    )
    r = restart(mega, run, 1)
    assert r.checkpoint is None and "--mcore_model" in r.note and r.argv(["x"]) == ["x"], r
    assert not r.flag  # nothing for the nodes to agree on: all start from step 0


def test_the_log_monitor_follows_a_restart_without_the_announce_line(tmp_path):
    """No "logging file will be saved in" line seen (its rank log missing): the monitor finds
    logging.jsonl in the newest version folder; after a restart it moves to the next attempt's
    folder, not back to the ended one, and that attempt's repeats replace the old steps."""
    import os

    from tunedeck.core.backends.swift import SwiftLogMonitor

    def write(folder: str, steps: range, loss: float, when: float) -> None:
        f = tmp_path / "out" / folder / "logging.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(
            "".join(
                json.dumps({"loss": loss + s, "global_step/max_steps": f"{s}/6"}) + "\n"
                for s in steps
            )
        )
        os.utime(f, (when, when))

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    m = SwiftLogMonitor(run, tmp_path / "out", 0)
    write("v0-20260101-000000", range(1, 5), 10.0, 1e9)
    m.tick(0.0, [])
    m.restarted(2)
    m.tick(0.0, [])  # the next attempt's folder is not there yet
    write("v1-20260101-000100", range(3, 7), 20.0, 1e9 + 100)
    m.tick(0.0, [])
    m.close([])
    steps = [
        (e["step"], e["loss"])
        for e in map(json.loads, run.event_file(0).open())
        if e["kind"] == "step"
    ]
    assert steps == [
        (1, 11.0),
        (2, 12.0),
        (3, 13.0),
        (4, 14.0),
        (3, 23.0),
        (4, 24.0),
        (5, 25.0),
        (6, 26.0),
    ], steps


def test_backend_refuses_flags_that_do_not_exist(tmp_path):
    spec = _spec('[swift]\nextra_args = ["--sp_size", "2", "--train_type", "lora"]\n')
    with pytest.raises(SwiftPlanError) as e:
        plan_run(spec, RunDir(tmp_path))
    assert "--sequence_parallel_size" in str(e.value) and "--tuner_type" in str(e.value)
    spec = _spec('[swift]\nextra_args = ["--deepspeed", "default-zero3"]\n')
    with pytest.raises(SwiftPlanError, match="zero3"):
        plan_run(spec, RunDir(tmp_path))


@needs_swift
def test_swift_presets_accepted_by_ms_swift_parser(model_cache):
    jobs, names = [], []
    for p in SWIFT_PRESETS:
        spec = resolve(load_spec(p), gpu_count=8)
        args = swift_args(spec, "/tmp/out")
        assert flags.validate(spec.swift.command, args) == [], p.name
        if spec.swift.command.startswith("megatron"):
            # megatron-core is not installed here: its classes are read from ms-swift's source
            assert "--tensor_model_parallel_size" in args
            continue
        jobs.append((spec.swift.command, args))
        names.append(p.name)
    # the check can fail: a blog flag must come back as remaining argv
    jobs.append(("sft", ["--model", "m", "--train_type", "lora"]))
    results = flags.parser_check(jobs)
    for name, res in zip(names, results):
        assert res["error"] is None and res["remaining"] == [], (name, res)
    assert results[-1]["remaining"] == ["--train_type", "lora"]
    assert len(names) >= 5


def _cpu_spec(tmp_path, name: str, train: str, extra_args: str, more: str = ""):
    """A 2-process CPU ms-swift run of the built-in tiny model on the demo chats."""
    spec = tmp_path / "swift.toml"
    spec.write_text(f"""name = "{name}"
backend = "swift"
[model]
path = "builtin:tiny-qwen2"
[data]
path = "{REPO / "presets" / "data" / "demo_chat.jsonl"}"
max_length = 48
[train]
{train}
per_device_batch_size = 2
learning_rate = 5e-3
[cluster]
device = "cpu"
cpu_procs = 2
[swift]
extra_args = {extra_args}
{more}""")
    return spec


@pytest.mark.slow
@needs_swift
def test_swift_cpu_run_shows_loss_in_metrics(td_home, tmp_path):
    spec = _cpu_spec(tmp_path, "swift-cpu", "max_steps = 3", '["--logging_steps", "1"]')
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=400)
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((td_home / "runs" / run_id / "plan.json").read_text())
    argv = plan["nodes"][0]["argv"]
    assert argv[argv.index("-m", 3) + 1] == "swift.cli.sft" and "--use_cpu" in argv
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(isinstance(r["loss"], float) and r["loss"] > 0 for r in recs)
    assert recs[0]["learning_rate"] > 0
    # what the monitor writes as it closes (the end it read in logging.jsonl) reaches run.db
    with closing(sqlite3.connect(td_home / "runs" / run_id / "run.db")) as db:
        kinds = {k for (k,) in db.execute("SELECT kind FROM events")}
    assert "end" in kinds, kinds


@pytest.mark.slow
@needs_swift
def test_swift_restart_resumes_from_its_checkpoint(td_home, tmp_path):
    """A real ms-swift CPU run whose rank 1 dies at step 7 of the first attempt (a plugin
    callback; steps 1-6 logged, checkpoint-4 written): the agent restarts it with
    --resume_from_checkpoint naming that checkpoint and says so; ms-swift goes on from step 5
    rather than step 1, and the metrics keep its second 5 and 6, not the first."""
    plugin = REPO / "tests" / "scripts" / "swift_crash_once.py"
    spec = _cpu_spec(
        tmp_path,
        "swift-restart",
        "max_steps = 8\nsave_steps = 4",
        f'["--logging_steps", "1", "--external_plugins", "{plugin}", "--callbacks", "crash_once"]',
        '[run]\nmax_restarts = 1\nrestart_pause_s = 0.5\n[env]\nSWIFT_CRASH_AT_STEP = "7"\n',
    )
    proc = cli("launch", str(spec), "--wait", "--json", home=td_home, check=False, timeout=600)
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    run_dir = td_home / "runs" / run_id
    state = json.loads((run_dir / "state.json").read_text())
    log = (run_dir / "logs" / "agent.log").read_text()
    assert proc.returncode == 0 and state["status"] == "succeeded", (state, log[-3000:])
    assert [a["exit_code"] != 0 for a in state["attempts"]] == [True, False], state
    # the restart line and the second attempt's command name the checkpoint
    assert "restarting in 0.5s from checkpoint-4" in log, log[-3000:]
    second = [ln for ln in log.splitlines() if "attempt 1: torchrun pid" in ln]
    assert len(second) == 1 and second[0].count("--resume_from_checkpoint") == 1, second
    assert second[0].split("--resume_from_checkpoint ")[1].split()[0].endswith("checkpoint-4")
    # ms-swift went on from step 5 in its next version folder: no step 1-4 there
    out = run_dir / "output"
    logs = sorted(out.glob("v*-*/logging.jsonl"))
    assert len(logs) == 2, logs
    resumed = [r for r in map(json.loads, logs[1].open()) if "loss" in r]
    assert [r["global_step/max_steps"] for r in resumed] == ["5/8", "6/8", "7/8", "8/8"]
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == list(range(1, 9))
    assert [r["loss"] for r in recs[4:]] == pytest.approx([r["loss"] for r in resumed])
    # (on CPU ms-swift repeats steps 5 and 6 exactly: which attempt wrote them is in `t`)
    second_start = state["launches"][1]["t"]
    assert all(r["t"] > second_start for r in recs[4:]), (second_start, recs[4:])
