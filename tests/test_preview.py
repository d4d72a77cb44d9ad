"""One answer to "what will this spec run?": core's `preview` (core/preflight/preview.py),
which the compose screen's side pane and `tunedeck launch --dry-run` both render. Its verdict
on each GPU is `fit` (core/estimate/fit.py) through `gpu_fits`, the same verdicts preflight's
memory check decides from, so the pane and the gate cannot disagree."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DEMO, REPO, cli
from tunedeck.core.estimate import QWEN25
from tunedeck.core.estimate.fit import MARGIN, fit
from tunedeck.core.preflight.config import check_gpu_memory
from tunedeck.core.preflight.preview import preview, settings_lines
from tunedeck.core.preflight.runner import make_context
from tunedeck.core.spec import RunSpec, load_spec, set_values
from tunedeck.core.telemetry.gpus import Gpu, GpuFacts
from tunedeck.cli.launch import dry_run_text
from tunedeck.cli.main import main
from tunedeck.tui.screens.compose import FIT_STYLE, build_preview

HAS_SWIFT = __import__("importlib.util").util.find_spec("swift") is not None
QWEN7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}


def facts_of(*caps: float, name: str = "NVIDIA H200") -> GpuFacts:
    return GpuFacts(
        gpus=[Gpu(i, name, cap, (9, 0)) for i, cap in enumerate(caps)],
        driver="580.1",
        cuda_driver=(13, 0),
    )


def big_model(tmp_path):
    m = tmp_path / "qwen7b"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_text(json.dumps(QWEN7B))
    return m


def demo(**values) -> RunSpec:
    return set_values(load_spec(DEMO, ["train.max_steps=3", "cluster.master_port=29500"]), values)


def per_gpu(spec: RunSpec, facts: GpuFacts) -> float:
    return preview(spec, facts).estimate.memory.per_gpu_gib


def pane_verdicts(spec: RunSpec, facts: GpuFacts) -> tuple[str, dict[int, str]]:
    """(the pane's verdict, {GPU index: status}) as the compose screen renders them: each
    GPU line's status read back from its colour."""
    data = build_preview(spec, facts)
    by_style = {v: k for k, v in FIT_STYLE.items()}
    out = {}
    for line in data.facts.split():
        if line.plain.startswith("  GPU"):
            (style,) = {str(s.style) for s in line.spans}
            out[int(line.plain.split()[0].removeprefix("GPU"))] = by_style[style]
    return data.fit, out


def agree(spec: RunSpec, facts: GpuFacts, monkeypatch) -> str:
    """The pane and the gate say the same about `spec` on `facts`; their status."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gate = check_gpu_memory(make_context(spec=spec, gpu_probe=lambda: facts))
    status, gpus = pane_verdicts(spec, facts)
    assert status == gate.status, (status, gpus, gate)
    if gate.status in ("pass", "warn", "fail"):
        # every GPU has its line, and the one that decides is the gate's
        assert gpus, gate
        rank = ["pass", "warn", "fail"]
        assert max(gpus.values(), key=rank.index) == gate.status, (gpus, gate)
    else:
        assert not gpus, (gpus, gate)
    return gate.status


def test_fit_is_the_one_verdict_and_margin_is_one_constant():
    from tunedeck.core.estimate import advisor

    assert advisor.MARGIN is MARGIN
    assert fit(10, 20).status == "pass" and fit(10, 20).reason == "fits"
    assert fit(19, 20).status == "warn" and f"above {MARGIN:.0%}" in fit(19, 20).reason
    assert fit(21, 20).status == "fail" and fit(21, 20).reason == "will not fit"
    bound = fit(21, 20, bound_length=32768)
    assert bound.status == "warn" and "32768 tokens (data.max_length unset)" in bound.reason
    assert fit(19, 20, bound_length=32768).status == "warn"  # the margin still counts


def test_the_pane_and_the_memory_check_agree_on_each_gpu(tmp_path, monkeypatch):
    small = demo()
    assert agree(small, facts_of(139.8, 139.8), monkeypatch) == "pass"
    big = demo(
        **{
            "model.path": str(big_model(tmp_path)),
            "data.max_length": 2048,
            "train.per_device_batch_size": 8,
            "cluster.device": "cuda",
        }
    )
    assert agree(big, facts_of(24.0, 24.0, name="NVIDIA A10G"), monkeypatch) == "fail"
    per = per_gpu(big, facts_of(139.8, 139.8))
    # GPUs sized around the estimate: one each side of the margin, one past capacity
    roomy, tight, short = per / (MARGIN * 0.9), per / ((1 + MARGIN) / 2), per * 0.9
    assert agree(big, facts_of(roomy, roomy), monkeypatch) == "pass"
    assert agree(big, facts_of(roomy, tight), monkeypatch) == "warn"
    assert agree(big, facts_of(roomy, tight, short), monkeypatch) == "fail"
    _, lines = pane_verdicts(big, facts_of(roomy, tight, short))
    assert lines == {0: "pass", 1: "warn", 2: "fail"}
    # no GPU to compare with; a cpu run
    assert agree(big, GpuFacts(error="none here"), monkeypatch) == "skip"
    assert agree(demo(**{"cluster.device": "cpu"}), facts_of(24.0), monkeypatch) == "skip"


def test_a_gpu_selection_that_names_no_gpu_here_is_judged_on_all_of_them(tmp_path, monkeypatch):
    """preflight compared against every GPU when cluster.gpus named none that exist; the pane
    used to say there was no GPU to compare with."""
    spec = demo(
        **{
            "model.path": str(big_model(tmp_path)),
            "data.max_length": 2048,
            "train.per_device_batch_size": 8,
            "cluster.device": "cuda",
            "cluster.nproc_per_node": 2,
            "cluster.gpus": "6,7",
        }
    )
    assert agree(spec, facts_of(24.0, 24.0, name="NVIDIA A10G"), monkeypatch) == "fail"


@pytest.mark.skipif(not HAS_SWIFT, reason="ms-swift not installed")
def test_past_capacity_only_at_ms_swifts_length_limit_warns_in_the_pane_too(tmp_path, monkeypatch):
    """The case the pane lacked: an ms-swift spec that leaves data.max_length unset is sized at
    the model's length limit, so past a GPU it is a warning (the data decides), not a wall;
    the pane said "will not fit" in red on each GPU while the gate warned."""
    path = tmp_path / "s.toml"
    path.write_text(
        f'backend = "swift"\n[model]\npath = "{big_model(tmp_path)}"\n[data]\npath = '
        f'"{REPO / "presets" / "data" / "demo_chat.jsonl"}"\n[cluster]\nmaster_port = 29500\n'
    )
    spec = load_spec(path)
    small = facts_of(22.0, name="NVIDIA A10G")
    assert agree(spec, small, monkeypatch) == "warn"
    text = build_preview(spec, small).facts.plain
    assert "will not fit if a batch reaches 32768 tokens (data.max_length unset)" in text, text
    # with the length set, the same overflow is a wall in both
    spec = set_values(spec, {"data.max_length": 32768})
    assert agree(spec, small, monkeypatch) == "fail"


def test_the_dry_run_prints_the_preview(tmp_path, td_home, monkeypatch, capsys):
    """`launch --dry-run` prints core's Preview: the launch script, then each of its facts."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    big = big_model(tmp_path)
    over = [
        f"model.path={big}",
        "data.max_length=2048",
        "train.per_device_batch_size=8",
        "cluster.device=cuda",
        "cluster.master_port=29511",
    ]
    facts = facts_of(139.8, 24.0)
    monkeypatch.setattr("tunedeck.core.preflight.base.probe_gpus", lambda: facts)
    assert main(["launch", str(DEMO), *sum((["--set", o] for o in over), []), "--dry-run"]) == 0
    out = capsys.readouterr().out
    p = preview(load_spec(DEMO, over), facts)
    assert out == dry_run_text(p)
    assert out.startswith(p.script) and "--master_port 29511" in p.script
    comments = out[len(p.script) :].splitlines()
    assert all(line.startswith("# ") for line in comments)  # still a script
    assert f"# {p.summary}" in comments and f"# {p.memory_line}" in comments
    assert "# port 29511 (cluster.master_port)" in comments
    assert [g.fit.status for g in p.gpus] == ["pass", "fail"]
    for g in p.gpus:
        assert f"#   {g.line}" in comments
    assert "#   GPU1 NVIDIA H200 24.0 GiB: will not fit" in "\n".join(comments)


def test_the_dry_run_in_a_child_process_is_the_preview_too(tmp_path, td_home, monkeypatch):
    """The real command line: a cpu script run (no GPU probed) with a secret flag: the
    script, the summary, the port, the memory line and the `ps` warning, as preview() has
    them."""
    script = REPO / "tests" / "scripts" / "ddp_toy.py"
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "s"\nbackend = "script"\n[script]\npath = "{script}"\n'
        f'args = ["--api_key", "SECRETx"]\n[cluster]\ndevice = "cpu"\nmaster_port = 29512\n'
    )
    out = cli("launch", str(path), "--dry-run", home=td_home).stdout
    p = preview(load_spec(path))
    assert out == dry_run_text(p)
    assert p.warnings and "`ps`" in p.warnings[0] and "SECRETx" not in out


@pytest.mark.skipif(not HAS_SWIFT, reason="ms-swift not installed")
def test_the_dry_run_lists_ms_swift_settings_as_the_pane_does(tmp_path, td_home, monkeypatch):
    monkeypatch.setattr("tunedeck.core.preflight.base.probe_gpus", lambda: facts_of(139.8))
    spec = load_spec(REPO / "presets" / "swift-ddp-lora-2gpu.toml", ["cluster.master_port=29513"])
    p = preview(spec, facts_of(139.8))
    text = dry_run_text(p)
    pane = build_preview(spec, facts_of(139.8)).body.plain
    assert p.settings
    for line in settings_lines(p.settings):
        assert f"#   {line}\n" in text and line in pane


def test_the_pane_and_estimate_say_when_the_base_runs_in_fp8(tmp_path):
    """The fp8 frozen base changes what a fine-tune ends with (docs/benchmarks.md, the fp8
    study): the compose pane's summary and the estimate's notes name it, only when it is on."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN25["7b"]))
    preset = REPO / "presets" / "builtin-7b-lora-h200.toml"
    said = {}
    for on in ("true", "false"):
        spec = load_spec(preset, [f"model.path={tmp_path}", f"method.fp8_base={on}"])
        p = preview(spec, facts_of(139.8))
        notes = " ".join(p.estimate.memory.notes)
        pane = build_preview(spec, facts_of(139.8)).facts.plain
        said[on] = ("frozen base in fp8" in p.summary, "frozen base in fp8" in notes, pane)
    assert said["true"][:2] == (True, True) and "frozen base in fp8" in said["true"][2]
    assert said["false"][:2] == (False, False) and "frozen base in fp8" not in said["false"][2]
