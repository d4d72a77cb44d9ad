"""From a run to a model people use, on one real CPU demo run (torchrun, 2 ranks over gloo,
LoRA, 20 steps) launched with every tracker on: the trackers' files read back with their own
readers and compared with `tunedeck metrics`; the merged export loaded with transformers and
compared with base + adapter; the chat screen in tmux (prompt -> streamed answer -> side by
side)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from conftest import DEMO, REPO, Tmux, cli, cli_json, cli_launch, wait_for

pytest.importorskip("torch")
pytest.importorskip("peft")

STEPS = 20


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_cache):
    """(home, run_id, run_dir, metrics by step) of one finished demo run, trackers on."""
    home = tmp_path_factory.mktemp("modelout-home")
    sets = [
        f"train.max_steps={STEPS}",
        "train.save_steps=10",
        "tracking.wandb=offline",
        "tracking.mlflow=true",
    ]
    out, ended = cli_launch(
        "launch", str(DEMO), *[a for s in sets for a in ("--set", s)], home=home, timeout=600
    )
    run_id = out["run_id"]
    assert ended["run_id"] == run_id and ended["step"] == STEPS, ended
    assert cli_json("status", run_id, home=home)["status"] == ended["status"] == "succeeded"
    metrics = {r["step"]: r for r in cli_json("metrics", run_id, home=home)}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    return home, run_id, Path(out["run_dir"]), metrics


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)  # TensorBoard keeps float32


def test_tensorboard_events_match_metrics(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home, run_id, run_dir, metrics = run
    tb = run_dir / "tracking" / "tensorboard"
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for tag, key in (
        ("train/loss", "loss"),
        ("train/lr", "learning_rate"),
        ("train/grad_norm", "grad_norm"),
    ):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == sorted(metrics), tag
        bad = [s for s in got if not close(got[s], metrics[s][key])]
        assert not bad, f"{tag} differs from `tunedeck metrics` at steps {bad}"
    assert "perf/tokens_per_s" in acc.Tags()["scalars"]
    assert [e.value for e in acc.Scalars("tracking/dropped_points")] == [0]
    spec_text = acc.Tensors("spec/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'name = "demo"' in spec_text and "max_steps = 20" in spec_text
    # `tunedeck tb` names the folder to serve
    assert str(tb) in cli("tb", run_id, home=home).stdout


def _wandb_records(path: Path):
    """The offline run's transaction log, each record parsed with W&B's own protobuf
    schema (wandb 0.2x dropped its Python reader; the log is LevelDB's record framing)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, part, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        size, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if size == 0 and kind == 0:
            pos += left
            continue
        part += data[pos + 7 : pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(part)
            yield rec
            part = b""


def test_wandb_offline_run_matches_metrics(run):
    pytest.importorskip("wandb", reason="the trackers extra (wandb) is not installed")
    _home, run_id, run_dir, metrics = run
    (log,) = (run_dir / "tracking" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    history: dict[int, dict[str, float]] = {}
    config, notes = {}, ""
    for rec in _wandb_records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            history[rec.history.step.num] = items
        elif kind == "run":  # the config given to wandb.init travels in the run record
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            notes = rec.run.notes
    assert sorted(history) == sorted(metrics)
    bad = [s for s, h in history.items() if not close(h["train/loss"], metrics[s]["loss"])]
    assert not bad, f"W&B loss differs at steps {bad}"
    assert config["train"]["max_steps"] == STEPS and config["name"] == "demo"
    assert "tunedeck.core.train" in notes  # the run's command (launch.sh) as notes


def test_trackers_finish_before_the_agent_ends(run):
    """Every tracker has written its files out and stopped its own helpers (W&B's service)
    before the agent's end: nothing is left for the agent to kill mid-write."""
    _home, _run_id, run_dir, _metrics = run
    agent_log = (run_dir / "logs" / "agent.log").read_text()
    assert "trackers: 0 points dropped" in agent_log
    assert "left behind" not in agent_log and "Traceback" not in agent_log, agent_log[-3000:]


def test_mlflow_file_store_matches_metrics(run):
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    from mlflow.tracking import MlflowClient

    _home, run_id, run_dir, metrics = run
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir / "tracking" / "mlruns").as_uri())
    exp = client.get_experiment_by_name("tunedeck")
    (mrun,) = client.search_runs([exp.experiment_id], f"tags.`tunedeck.run_id` = '{run_id}'")
    assert mrun.info.status == "FINISHED"
    hist = {m.step: m.value for m in client.get_metric_history(mrun.info.run_id, "train/loss")}
    assert sorted(hist) == sorted(metrics)
    assert all(close(hist[s], metrics[s]["loss"]) for s in hist)
    assert mrun.data.tags["tracking.dropped_points"] == "0"


def test_export_merged_loads_with_transformers_same_logits(run):
    import torch
    from transformers import AutoModelForCausalLM

    from tunedeck.core.api import export_model, pick_checkpoint
    from tunedeck.core.modelout import base_model_path, load_model, load_tokenizer

    home, run_id, run_dir, _metrics = run
    # before any export, vLLM serves the base with the last checkpoint's adapter
    serve = cli("export", run_id, "--format", "vllm", home=home).stdout
    assert "--enable-lora" in serve and "--served-model-name" not in serve
    assert f"--lora-modules demo={run_dir / 'output' / f'checkpoint-{STEPS}'}" in serve, serve
    # the verb as users run it: bf16, the last checkpoint, into <run dir>/exports/
    out = cli_json("export-model", run_id, home=home, timeout=300)
    assert out["step"] == STEPS and out["kind"] == "merged"
    bf16 = Path(out["path"])
    card = (bf16 / "README.md").read_text()
    assert run_id in card and "lora r=16" in card and "train loss" in card

    src = pick_checkpoint(run_dir, "last")
    fp32 = export_model(src, run_dir / "exports" / "fp32", dtype="fp32")
    base, _ = base_model_path(src.spec)
    reference = load_model(src, base, torch.float32)  # base + adapter, unmerged (peft)
    tok = load_tokenizer(src)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "How do I speed up the data loader?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    with torch.inference_mode():
        want = reference(input_ids=ids).logits
        got32 = AutoModelForCausalLM.from_pretrained(str(fp32)).eval()(input_ids=ids).logits
        m16 = AutoModelForCausalLM.from_pretrained(str(bf16)).eval()
        assert m16.dtype == torch.bfloat16
        got16 = m16(input_ids=ids).logits.float()
    scale = want.abs().max().item()
    assert (got32 - want).abs().max().item() <= 1e-4 * scale
    # bf16 keeps 8 bits of mantissa: a few parts in a thousand per weight, through 4 layers
    err16 = (got16 - want).abs().max().item()
    assert err16 <= 0.05 * scale, f"bf16 export differs by {err16} (logits up to {scale})"
    assert (got16.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9
    # once merged, vLLM serves the newest merged folder alone: no adapter, no --enable-lora
    serve = cli("export", run_id, "--format", "vllm", home=home).stdout
    assert f"  {fp32.resolve()} \\\n" in serve and "--served-model-name demo" in serve
    assert "lora" not in serve.split("vLLM on one node")[1], serve
    # the chat template travels with the export
    assert (bf16 / "chat_template.jinja").exists() or "chat_template" in (
        bf16 / "tokenizer_config.json"
    ).read_text()


def test_vllm_flags_checked_against_the_table():
    from tunedeck.core.backends.export import VLLM_MAX_LORA_RANKS, ExportError, _checked

    ok = ["--tensor-parallel-size", "2", "--enable-lora", "--lora-modules", "a=/x"]
    assert _checked([*ok, "--max-lora-rank", "32"])[-1] == "32"
    for bad, said in (
        (["--max-lora-rank", "24"], "takes one of"),  # vLLM's MaxLoRARanks only
        (["--lora-modules", "/x"], "NAME=PATH"),
        (["--enable-loras"], "no option --enable-loras"),
    ):
        with pytest.raises(ExportError, match=said):
            _checked(bad)
    assert 320 in VLLM_MAX_LORA_RANKS


def test_chat_screen_streams_base_and_tuned_side_by_side(run, tmp_path):
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("tmux not installed")
    home, run_id, _run_dir, _metrics = run
    t = Tmux(tmp_path / "tmux")
    try:
        env = {
            "TUNEDECK_HOME": str(home),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "TUNEDECK_CACHE": os.environ.get("TUNEDECK_CACHE", ""),
        }
        argv = [
            sys.executable,
            "-m",
            "tunedeck.cli",
            "chat",
            run_id,
            "--device",
            "cpu",
            "--max-new-tokens",
            "160",  # long enough to be seen mid-answer on a fast machine
        ]
        t.start("chat", argv, size=(120, 30), env=env, cwd=REPO)
        wait_for(lambda: "ready on cpu" in t.screen("chat"), 180, "the model to load")
        t.keys("chat", "how do I fix a slow data loader", "Enter")
        # a partial answer on screen while the generation goes on: each piece was handled
        # by the event loop while the worker thread kept decoding
        partial = wait_for(
            lambda: (s := t.screen("chat")) and "streaming…" in s and s,
            60,
            "a partial answer",
            poll=0.05,
        )

        def both_answered():
            s = t.screen("chat")
            return s if s.count("tok/s") == 2 else None

        done = wait_for(both_answered, 120, "both answers")
    finally:
        t.kill()
    title = next(line for line in done.splitlines() if "base model" in line)
    assert f"step {STEPS}" in title  # the two panes share a row: side by side
    body = [line for line in done.splitlines() if line.startswith("│")]
    left = "".join(line[1:59] for line in body).strip()
    right = "".join(line[61:119] for line in body).strip()
    assert left and right, done
    assert "streaming…" in partial


@pytest.mark.slow
def test_swift_run_mirrored_merged_by_swift_export_and_served(td_home, tmp_path):
    """A real 2-rank ms-swift LoRA run on CPU: the agent mirrors what it parsed from
    logging.jsonl into TensorBoard (matching `tunedeck metrics`); `export-model` merges through
    `swift export --adapters CKPT --merge_lora true --torch_dtype bfloat16`, whose argv the
    installed ms-swift's own ExportArguments parser reads (it refuses any flag left over); the
    bf16 folder loads with transformers and vLLM serves it alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    from tunedeck.core.backends.swift.version import installed_version

    if installed_version() is None:
        pytest.skip("ms-swift not installed")
    spec = tmp_path / "swift.toml"
    spec.write_text(f"""name = "swift-merge"
backend = "swift"
[model]
path = "builtin:tiny-qwen2"
[data]
path = "{REPO / "presets" / "data" / "demo_chat.jsonl"}"
max_length = 48
[train]
max_steps = 2
per_device_batch_size = 2
learning_rate = 5e-3
[cluster]
device = "cpu"
cpu_procs = 2
[swift]
extra_args = ["--logging_steps", "1", "--report_to", "none"]
""")
    run_id = cli_launch("launch", str(spec), home=td_home, timeout=400)[0]["run_id"]
    run_dir = td_home / "runs" / run_id
    metrics = {r["step"]: r for r in cli_json("metrics", run_id, home=td_home)}
    assert sorted(metrics) == [1, 2]
    acc = EventAccumulator(str(run_dir / "tracking" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert sorted(got) == [1, 2] and all(close(got[s], metrics[s]["loss"]) for s in got)

    proc = cli("export-model", run_id, "--json", home=td_home, timeout=300)
    out = json.loads(proc.stdout)
    ckpt = next((run_dir / "output").glob("v*-*/checkpoint-2"))
    said = f"swift.cli.export --adapters {ckpt} --merge_lora true --output_dir "
    assert out["kind"] == "merged" and said in proc.stderr, proc.stderr[-2000:]
    assert "Successfully merged LoRA" in proc.stderr  # ms-swift's own words
    # what ms-swift's own parser made of the argv (it prints its ExportArguments)
    parsed = proc.stderr.split("ExportArguments(", 1)[1]
    assert f"adapters=['{ckpt}']" in parsed and "merge_lora=True" in parsed
    assert "torch_dtype=torch.bfloat16" in parsed
    merged = Path(out["path"])
    assert run_id in (merged / "README.md").read_text()
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype="auto")
    assert str(model.dtype) == "torch.bfloat16"
    assert not any("lora" in n for n, _ in model.named_parameters())
    serve = cli("export", run_id, "--format", "vllm", home=td_home).stdout
    assert str(merged.resolve()) in serve and "--enable-lora" not in serve
