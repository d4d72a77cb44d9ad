"""Each preflight check fails for its real reason on this machine, and passes once the cause
is gone. GPU rules without a GPU run on recorded facts (GpuFacts), the same data NVML gives."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tunedeck.core.preflight import gate_record, make_context, ordered, run_checks
from tunedeck.core.spec import RunSpec, set_values
from tunedeck.core.telemetry.fake import FakePynvml
from tunedeck.core.telemetry.gpus import Gpu, GpuFacts, probe_gpus
from tests.conftest import REPO, cli

DEMO_DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
GOOD_ROW = {
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
}


def write_spec(tmp: Path, extra: str = "", data: Path = DEMO_DATA) -> Path:
    p = tmp / "spec.toml"
    p.write_text(f'name = "t"\n[data]\npath = "{data}"\n[cluster]\ndevice = "cpu"\n{extra}\n')
    return p


def check(spec_path: Path, cid: str, overrides=(), gpu_probe=None):
    ctx = make_context(spec_path, list(overrides), gpu_probe=gpu_probe)
    return next(r for r in run_checks(ctx) if r.id == cid)


def check_fixed(spec_path: Path, cid: str, overrides=(), gpu_probe=None):
    """(the check's result, the same check on the spec with its fix_set applied)."""
    ctx = make_context(spec_path, list(overrides), gpu_probe=gpu_probe)
    r = next(r for r in run_checks(ctx) if r.id == cid)
    assert r.fix_set, f"{cid} offers no value fix: {r}"
    fixed = make_context(spec=set_values(ctx.spec, r.fix_set), base=ctx.base, gpu_probe=gpu_probe)
    return r, next(x for x in run_checks(fixed) if x.id == cid)


def test_port_taken_fails_and_offers_a_free_one(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    spec = write_spec(tmp_path, f"master_port = {port}")
    try:
        r = check(spec, "net.port")
        assert r.status == "fail" and str(port) in r.detail
        offered = int(r.fix.split("master_port = ")[1].split()[0])
        assert offered != port
        assert r.fix_set == {"cluster.master_port": offered}  # the same port, as a value
        with socket.socket() as t:  # the offered port really is free
            t.bind(("127.0.0.1", offered))
        r, fixed = check_fixed(spec, "net.port")
        assert r.status == "fail" and fixed.status == "pass"
    finally:
        s.close()
    assert check(spec, "net.port").status == "pass"


def test_port_of_a_live_run_of_this_home_fails_with_its_id(tmp_path, monkeypatch):
    """Three launches on one fixed port: the later ones are refused at the gate, naming the run
    that holds the port, before its torchrun has even bound it."""
    from tests.test_manage import make_run
    from tunedeck.core.estimate.resolve import free_port
    from tunedeck.core.rundir import RunDir

    td_home = tmp_path / "home"  # no td_home: its teardown would stop the "live" run,
    monkeypatch.setenv("TUNEDECK_HOME", str(td_home))  # whose agent is this process
    port = free_port()
    spec = write_spec(tmp_path, f"master_port = {port}")
    assert check(spec, "net.port").status == "pass"
    live = RunDir(
        make_run(td_home / "runs", "20251124-090000-live-a1b2", name="live", status="running")
    )
    st = live.read_state()
    st["master_port"] = port
    live.write_state(st)
    r, fixed = check_fixed(spec, "net.port")
    assert r.status == "fail" and "20251124-090000-live-a1b2" in r.detail and str(port) in r.detail
    assert r.fix_set["cluster.master_port"] not in (port, 0)
    assert fixed.status == "pass"
    # a run on another host of a shared home, or one that ended, does not hold it here
    st["host"] = "elsewhere"
    live.write_state(st)
    assert check(spec, "net.port").status == "pass"
    st.update(host=os.uname().nodename, status="succeeded")
    live.write_state(st)
    assert check(spec, "net.port").status == "pass"
    # a run whose agent is gone (a stale state.json) does not hold it either
    st.update(status="running", agent_pid=2**22 + 7, agent_create_time=1.0)
    live.write_state(st)
    assert check(spec, "net.port").status == "pass"
    st.update(status="failed")
    live.write_state(st)


def test_broken_dataset_line_names_file_and_line(tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [
        json.dumps(GOOD_ROW),
        '{"messages": [broken',
        json.dumps(GOOD_ROW),
        json.dumps({"messages": [{"role": "user", "content": "no answer"}]}),
    ]
    data.write_text("\n".join(rows) + "\n")
    spec = write_spec(tmp_path, data=data)
    r = check(spec, "data.rows")
    assert r.status == "fail"
    assert f"{data}:2: not valid JSON" in r.detail and f"{data}:4: no assistant" in r.detail
    assert "2 rows" in r.detail
    assert check(spec, "data.rows", ["data.skip_bad_rows=true"]).status == "warn"
    r, fixed = check_fixed(spec, "data.rows")
    assert r.fix_set == {"data.skip_bad_rows": True} and fixed.status == "warn"
    data.write_text("\n".join([rows[0], rows[2]]) + "\n")
    r = check(spec, "data.rows")
    assert r.status == "pass" and "2 rows" in r.detail


def test_dataset_shows_a_tokenised_sample_when_a_tokenizer_exists(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hi hello there"] * 10, trainers.BpeTrainer(vocab_size=50))
    mdir = _model_dir(tmp_path)
    tok.save(str(mdir / "tokenizer.json"))
    spec = write_spec(tmp_path, f'[model]\npath = "{mdir}"')
    r = check(spec, "data.rows")
    assert r.status == "pass" and "tokens [" in r.detail, r.detail


def test_unwritable_output_dir_fails_even_for_root(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    spec = write_spec(tmp_path, f'[run]\noutput_dir = "{blocker}/out"')
    r = check(spec, "host.output_dir")
    assert r.status == "fail" and "is a file" in r.detail
    # /proc refuses file creation to root as well
    r = check(spec, "host.output_dir", ["run.output_dir=/proc/tunedeck-out"])
    assert r.status == "fail" and "not writable" in r.detail
    r = check(spec, "host.output_dir", [f"run.output_dir={tmp_path / 'out' / 'deep'}"])
    assert r.status == "pass", r.detail
    assert not (tmp_path / "out").exists()  # preflight creates nothing


def _model_dir(tmp: Path) -> Path:
    m = tmp / "model"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 128,
                "vocab_size": 100,
                "tie_word_embeddings": True,
            }
        )
    )
    (m / "model.safetensors").write_bytes(b"\0" * 64)
    return m


def test_missing_model_file_fails_then_passes(tmp_path):
    m = _model_dir(tmp_path)
    spec = write_spec(tmp_path, f'[model]\npath = "{m}"')
    r = check(spec, "model.files")
    assert r.status == "fail" and "no tokenizer" in r.detail
    (m / "tokenizer.json").write_text("{}")
    (m / "model.safetensors").unlink()
    r = check(spec, "model.files")
    assert r.status == "fail" and "no weights" in r.detail
    (m / "model.safetensors").write_bytes(b"\0" * 64)
    (m / "config.json").rename(m / "config.bak")
    assert "config.json: missing" in check(spec, "model.files").detail
    (m / "config.bak").rename(m / "config.json")
    assert check(spec, "model.files").status == "pass"


def test_hub_id_not_cached_offline_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = write_spec(tmp_path, '[model]\npath = "someorg/some-model"')
    r = check(spec, "model.files")
    assert r.status == "fail" and "not in the local cache" in r.detail
    snap = tmp_path / "hf" / "hub" / "models--someorg--some-model" / "snapshots" / "abc"
    snap.parent.mkdir(parents=True)
    _model_dir(tmp_path).rename(snap)
    (snap / "tokenizer.json").write_text("{}")
    assert check(spec, "model.files").status == "pass"


@pytest.mark.skipif(bool(probe_gpus().gpus), reason="this machine has GPUs")
def test_two_gpus_requested_where_none_exist(tmp_path):
    spec = write_spec(tmp_path)
    r = check(spec, "gpu.count", ["cluster.device=cuda", "cluster.nproc_per_node=2"])
    assert r.status == "fail" and "asks for 2 GPU" in r.detail and "none are visible" in r.detail
    assert check(spec, "gpu.count").status == "skip"  # device cpu: not applicable


def test_nccl_socket_ifname_must_exist(tmp_path):
    spec = write_spec(tmp_path)
    r = check(spec, "net.nccl_env", ["env.NCCL_SOCKET_IFNAME=nosuchif9"])
    assert r.status == "fail" and "nosuchif9" in r.detail
    assert check(spec, "net.nccl_env", ["env.NCCL_SOCKET_IFNAME=lo"]).status == "pass"


def test_workers_vs_cores_and_shm(tmp_path):
    spec = write_spec(tmp_path)
    r, fixed = check_fixed(spec, "host.cores", ["data.num_workers=64"])
    assert r.status == "warn" and "num_workers" in r.fix
    assert r.fix_set["data.num_workers"] < 64 and fixed.status == "pass", fixed.detail
    assert check(spec, "host.cores").status == "pass"
    assert check(spec, "host.shm").status == "skip"


def test_effective_batch_change_from_preset_warns(tmp_path):
    spec = write_spec(tmp_path)
    r, fixed = check_fixed(spec, "train.batch", ["train.grad_accum=4"])
    assert r.status == "warn" and "spec file gives" in r.detail
    assert r.fix_set == {"train.grad_accum": 1} and fixed.status == "pass"
    # a batch accumulation alone cannot restore offers no value
    r = check(spec, "train.batch", ["train.per_device_batch_size=3"])
    assert r.status == "warn" and not r.fix_set
    assert check(spec, "train.batch").status == "pass"


def test_backend_versions_and_saving(tmp_path):
    spec = write_spec(tmp_path)
    r = check(spec, "env.backend")
    assert r.status == "pass" and "peft" in r.detail
    r = check(spec, "env.backend", ["model.attn_impl=flash_attention_2"])
    assert r.status == "fail" and "flash-attn not installed" in r.detail  # not in this venv
    r, fixed = check_fixed(spec, "train.saving", ["train.max_steps=5000", "train.save_steps=0"])
    assert r.status == "warn" and "save_steps" in r.fix
    assert r.fix_set == {"train.save_steps": 500} and fixed.status == "pass"
    assert not check(spec, "env.backend", ["model.attn_impl=flash_attention_2"]).fix_set


# -- GPU rules on recorded facts (a 2×H200 box like tests/fixtures/h200/recorded/env.txt) ------------


def h200s(n=2, **kw) -> GpuFacts:
    f = GpuFacts(
        gpus=[Gpu(i, "NVIDIA H200", 139.8, (9, 0)) for i in range(n)],
        driver="580.1",
        cuda_driver=(13, 0),
        **kw,
    )
    f.links = {(0, 1): ("NVLink", True)} if n == 2 else {}
    return f


def gpu_spec(tmp_path, extra=""):
    return write_spec(tmp_path, extra).read_text().replace('device = "cpu"', 'device = "cuda"')


def ctx_for(tmp_path, facts, extra="", overrides=()):
    p = tmp_path / "g.toml"
    p.write_text(gpu_spec(tmp_path, extra))
    return {r.id: r for r in run_checks(make_context(p, list(overrides), gpu_probe=lambda: facts))}


def test_gpu_rules_on_recorded_facts(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    rs = ctx_for(tmp_path, h200s())
    assert rs["gpu.count"].status == "pass" and rs["gpu.uniform"].status == "pass"
    assert rs["gpu.bf16"].status == "pass" and rs["gpu.interconnect"].status == "pass"
    assert rs["mem.fit"].status == "pass"
    rs = ctx_for(tmp_path, h200s(), overrides=["cluster.nproc_per_node=4"])
    assert rs["gpu.count"].status == "fail"
    assert rs["gpu.count"].fix_set == {"cluster.nproc_per_node": 2}
    mixed = h200s()
    mixed.gpus[1] = Gpu(1, "Tesla V100-SXM2-32GB", 32.0, (7, 0))
    rs = ctx_for(tmp_path, mixed, overrides=["model.dtype=bfloat16"])
    assert rs["gpu.uniform"].status == "warn" and rs["gpu.bf16"].status == "fail"
    assert rs["gpu.bf16"].fix_set == {"model.dtype": "float16"}
    assert ctx_for(tmp_path, mixed, overrides=["model.dtype=float16"])["gpu.bf16"].status != "fail"
    assert rs["gpu.fp8"].status == "skip"  # method.fp8_base off
    assert (
        ctx_for(tmp_path, h200s(), overrides=["method.fp8_base=true"])["gpu.fp8"].status == "pass"
    )
    a100s = h200s()
    a100s.gpus = [Gpu(g.index, "NVIDIA A100-SXM4-80GB", 80.0, (8, 0)) for g in a100s.gpus]
    fp8 = ctx_for(tmp_path, a100s, overrides=["method.fp8_base=true"])["gpu.fp8"]
    assert fp8.status == "fail" and "sm_80" in fp8.detail
    assert fp8.fix_set == {"method.fp8_base": False}
    nop2p = h200s()
    nop2p.links = {(0, 1): ("across CPU sockets", False)}
    rs = ctx_for(tmp_path, nop2p)
    assert (
        rs["gpu.interconnect"].status == "warn" and "NCCL_P2P_DISABLE" in rs["gpu.interconnect"].fix
    )
    assert rs["gpu.interconnect"].fix_set == {"env.NCCL_P2P_DISABLE": "1"}
    rs = ctx_for(tmp_path, h200s(), overrides=["env.NCCL_P2P_DISABLE=1"])
    assert rs["gpu.interconnect"].status == "warn" and "remove" in rs["gpu.interconnect"].fix
    # None removes the spec's variable
    assert rs["gpu.interconnect"].fix_set == {"env.NCCL_P2P_DISABLE": None}
    old = h200s()
    old.cuda_driver = (11, 8)
    assert ctx_for(tmp_path, old)["gpu.driver"].status in ("fail", "warn", "pass")


def test_gpu_rules_on_facts_probed_from_fake_nvml(tmp_path, monkeypatch):
    """The whole path on a fake NVML: telemetry's probe -> ctx.gpus -> the checks."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    fake = FakePynvml(2, name="NVIDIA H200", driver="580.1")
    rs = ctx_for(tmp_path, probe_gpus(fake))
    assert rs["gpu.count"].status == "pass" and "2 GPU(s)" in rs["gpu.count"].detail
    assert rs["gpu.uniform"].detail == "2 × NVIDIA H200, 140 GiB"
    assert (
        rs["gpu.interconnect"].status == "pass" and rs["gpu.interconnect"].detail == "0-1: NVLink"
    )
    old = FakePynvml(2, cc=(7, 0), nvlinks=0, p2p=False)  # V100-like, PCIe, P2P broken
    rs = ctx_for(tmp_path, probe_gpus(old), overrides=["model.dtype=bfloat16"])
    assert rs["gpu.bf16"].status == "fail" and "sm_70" in rs["gpu.bf16"].detail
    assert rs["gpu.interconnect"].status == "warn"
    assert "across CPU sockets (no P2P)" in rs["gpu.interconnect"].detail
    rs = ctx_for(
        tmp_path, probe_gpus(FakePynvml(no_driver=True)), overrides=["cluster.nproc_per_node=2"]
    )
    assert rs["gpu.count"].status == "fail" and "no NVIDIA driver" in rs["gpu.count"].detail


def test_cli_exit_codes_and_json(tmp_path, td_home):
    spec = write_spec(tmp_path)
    p = cli("preflight", str(spec), "--json", home=td_home)
    out = json.loads(p.stdout)
    assert out["ok"] and out["summary"]["fail"] == 0
    assert {c["id"] for c in out["checks"]} >= {"net.port", "data.rows", "model.files"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = cli(
            "preflight",
            str(spec),
            "--set",
            f"cluster.master_port={s.getsockname()[1]}",
            home=td_home,
            check=False,
        )
    assert p.returncode == 1 and "[FAIL] Rendezvous port" in p.stdout


@pytest.mark.slow
def test_smoke_run_launches_three_real_steps(tmp_path, td_home):
    p = cli(
        "preflight",
        str(REPO / "presets" / "demo.toml"),
        "--smoke",
        "--json",
        home=td_home,
        check=False,
        timeout=600,
    )
    out = json.loads(p.stdout)
    smoke = out["checks"][-1]
    assert smoke["id"] == "smoke.run" and smoke["status"] == "pass", (smoke, p.stderr)
    assert p.returncode == 0 and "3 steps" in smoke["detail"]


async def test_preflight_screen_fills_live_and_reruns(tmp_path, td_home):
    from textual.app import App
    from textual.widgets import DataTable

    from tunedeck.core.spec import load_spec
    from tunedeck.tui.screens.preflight import PreflightScreen

    spec = write_spec(tmp_path)

    class Host(App):
        def on_mount(self):
            self.push_screen(PreflightScreen(load_spec(spec), spec, gate=False))

    app = Host()
    async with app.run_test() as pilot:
        screen = app.screen

        async def settled():
            for _ in range(200):
                await pilot.pause(0.05)
                if screen.sub_title:
                    return
            raise AssertionError("checks never finished")

        await settled()
        table = screen.query_one("#checks", DataTable)
        assert table.row_count == len(screen.results) >= 15
        assert screen.check_action("launch", ()) is False  # gate=False: a checklist only
        assert "fail" not in screen.sub_title.split(", ")[2] or "0 failed" in screen.sub_title
        screen.sub_title = ""
        await pilot.press("r")
        await settled()
        assert table.row_count == len(screen.results)
        await pilot.press("escape")
        assert not isinstance(app.screen, PreflightScreen)


def test_plan_check_builds_the_launch_command_or_names_what_stops_it(tmp_path):
    """The same plan_run a launch uses: a plan ms-swift could not run fails preflight."""
    spec = write_spec(tmp_path)
    r = check(spec, "spec.plan")
    assert r.status == "pass" and "-m tunedeck.core.train" in r.detail
    bad = write_spec(
        tmp_path, '[swift]\ncommand = "megatron-sft"\n[parallel]\nstrategy = "megatron"\n'
    ).read_text()
    spec.write_text('backend = "swift"\n' + bad)
    r = check(spec, "spec.plan")
    assert r.status == "fail" and "megatron commands need GPUs" in r.detail
    spec.write_text(
        f'name = "t"\nbackend = "script"\n[script]\npath = "{tmp_path}/gone.py"\n'
        '[cluster]\ndevice = "cpu"\n'
    )
    r = check(spec, "spec.plan")
    assert r.status == "fail" and "script.path" in r.detail and "gone.py" in r.detail


def _big_model_dir(tmp: Path) -> Path:
    m = tmp / "big"
    m.mkdir()
    (m / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 3584,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "intermediate_size": 18944,
                "vocab_size": 152064,
                "tie_word_embeddings": False,
            }
        )
    )
    return m


def test_memory_fit_offers_gradient_checkpointing(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    small = GpuFacts(
        gpus=[Gpu(i, "NVIDIA A10G", 22.0, (8, 6)) for i in range(2)],
        driver="550.1",
        cuda_driver=(12, 4),
    )
    extra = f'[model]\npath = "{_big_model_dir(tmp_path)}"\n[method]\ntype = "full"\n'
    rs = ctx_for(tmp_path, small, extra, ["data.max_length=4096"])
    r = rs["mem.fit"]
    assert r.status == "fail" and "will not fit" in r.detail
    assert r.fix_set == {"train.gradient_checkpointing": True}


def test_spec_valid_check_catches_a_form_spec_the_loader_never_saw():
    r = next(x for x in run_checks(make_context(spec=RunSpec())) if x.id == "spec.valid")
    assert r.status == "fail" and "data.path is required" in r.detail
    ok = set_values(RunSpec(), {"data.path": str(DEMO_DATA)})
    r = next(x for x in run_checks(make_context(spec=ok)) if x.id == "spec.valid")
    assert r.status == "pass"


def test_failures_sort_first_and_the_gate_record_names_them(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        spec = write_spec(tmp_path, f"master_port = {s.getsockname()[1]}")
        results = ordered(list(run_checks(make_context(spec))))
    assert results[0].id == "net.port" and results[0].status == "fail"
    ranks = [("fail", "warn", "pass", "skip").index(r.status) for r in results]
    assert ranks == sorted(ranks)
    rec = gate_record(
        results, by="tui", overridden=True, overridden_at=123.0, applied={"data.num_workers": 0}
    )
    assert rec["status"] == "overridden" and rec["overridden"] and rec["overridden_at"] == 123.0
    assert [f["id"] for f in rec["failed"]] == ["net.port"] and rec["failed"][0]["fix"]
    assert rec["applied"] == {"data.num_workers": 0} and rec["summary"]["fail"] == 1
    assert gate_record(results[1:], by="cli")["status"] == "passed"
    assert gate_record(None, by="cli")["status"] == "skipped"


def test_the_batch_check_counts_megatron_ranks_that_split_one_model_once():
    """8 ranks as tp 4 x pp 2 are one data-parallel rank: the check's effective batch is the
    one the compose form shows for the same spec (it was 8x that before)."""
    from tunedeck.core.preflight.config import check_effective_batch
    from tunedeck.core.spec import load_spec
    from tunedeck.tui.screens.compose import build_preview

    spec = load_spec(REPO / "presets" / "swift-megatron-lora-8xh100.toml")
    facts = h200s(8)
    r = check_effective_batch(make_context(spec=spec, gpu_probe=lambda: facts))
    assert r.detail.startswith("16 = 1 per device × 16 accumulation × 1 data-parallel"), r
    assert (
        "effective batch 16 = 1 per device x 1 data-parallel"
        in build_preview(spec, facts).facts.plain
    )


@pytest.mark.skipif(
    not __import__("importlib.util").util.find_spec("swift"), reason="ms-swift not installed"
)
def test_an_ms_swift_run_is_checked_with_ms_swifts_save_schedule_and_length():
    """Unset, ms-swift saves every 500 steps over 3 epochs: not tunedeck's "no saving, 100
    steps", which the check once reported as a short run without checkpoints."""
    from tunedeck.core.preflight.config import check_saving

    spec = set_values(RunSpec(), {"backend": "swift"})
    r = check_saving(make_context(spec=spec, gpu_probe=lambda: GpuFacts()))
    assert r.status == "pass" and r.detail.startswith("every 500 steps; 3 epochs (ms-swift"), r


def test_the_h200_preset_trains_on_an_fp8_base_and_preflight_says_how_to_run_it_elsewhere(
    tmp_path, monkeypatch
):
    # the preset with its frozen products in fp8 (22k against 17k tokens/s, docs/benchmarks.md):
    # on GPUs without fp8 units its preflight fails before any process starts, with the fix
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    preset = REPO / "presets" / "builtin-7b-lora-h200.toml"
    one_h200 = h200s()
    one_h200.gpus = one_h200.gpus[:1]
    a100 = h200s()
    a100.gpus = [Gpu(0, "NVIDIA A100-SXM4-80GB", 80.0, (8, 0))]

    def fp8_check(facts, overrides=("method.fp8_base=true",)):
        ctx = make_context(preset, list(overrides), gpu_probe=lambda: facts)
        return {r.id: r for r in run_checks(ctx)}["gpu.fp8"]

    assert fp8_check(one_h200).status == "pass"
    fail = fp8_check(a100)
    assert fail.status == "fail" and "A100" in fail.detail
    assert fail.fix_set == {"method.fp8_base": False}
    assert fp8_check(a100, ["method.fp8_base=false"]).status == "skip"
    assert fp8_check(a100, []).status == "skip"  # the preset keeps bf16 (the fp8 study)
