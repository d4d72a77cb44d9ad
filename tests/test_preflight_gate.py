"""The preflight gate: a launch from the TUI or `tunedeck launch` runs the checklist first; a
failure blocks it; a fix that is a value is one key; an override is a second, explicit key and
the run records it. Real launches of the demo on CPU, 3 steps."""

from __future__ import annotations

import json
import socket
import time

import pytest
from textual.app import App
from textual.widgets import DataTable, Static

from tests.conftest import cli, cli_json, cli_launch, DEMO, screen_host, until, wait_for
from tunedeck.core.preflight.base import CheckResult
from tunedeck.core.spec import load_spec
from tunedeck.core.telemetry.gpus import GpuFacts
from tunedeck.tui.screens.monitor import MonitorScreen
from tunedeck.tui.screens.preflight import PreflightScreen

# a check that fails on this CPU machine but cannot hurt a gloo run: NCCL is never used
HARMLESS_FAIL = "env.NCCL_SOCKET_IFNAME=nosuchif9"


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(
        PreflightScreen, "gpu_probe", staticmethod(lambda: GpuFacts(error="no GPU (recorded)"))
    )


def state_of(home, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def runs_made(home) -> list:
    root = home / "runs"
    return list(root.iterdir()) if root.exists() else []


async def test_gate_blocks_a_taken_port_and_one_key_fixes_it(td_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = load_spec(DEMO, ["train.max_steps=3", f"cluster.master_port={port}"])
        screen = PreflightScreen(spec, DEMO)
        async with screen_host(screen).run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: screen.finished, what="the checks")
            table = screen.query_one("#checks", DataTable)
            first = table.coordinate_to_cell_key((0, 0)).row_key.value
            assert first == "net.port" and screen.results["net.port"].status == "fail"
            assert screen.check_action("launch", ()) is None  # shown, but off
            assert "blocked: 1 failed" in str(screen.query_one("#gate-status").render())
            detail = str(screen.query_one("#check-detail", Static).render())
            offered = screen.results["net.port"].fix_set["cluster.master_port"]
            assert f"f applies: cluster.master_port = {offered}" in detail
            await pilot.press("l")
            await pilot.pause(0.3)
            assert not runs_made(td_home)  # blocked: nothing written
            await pilot.press("f")
            await until(pilot, lambda: screen.finished, what="the checks again")
            assert not screen.failed() and screen.spec.cluster.master_port == offered
            assert screen.results["net.port"].status == "pass"
            await pilot.press("l")
            await until(
                pilot, lambda: isinstance(pilot.app.screen, MonitorScreen), 60, "the monitor"
            )
            run_id = pilot.app.screen.run_ref
            await until(pilot, lambda: pilot.app.screen.snap is not None, 60, "a snapshot")
    st = wait_for(
        lambda: (s := state_of(td_home, run_id))["status"] in ("succeeded", "failed") and s,
        120,
        "the run's end",
    )
    assert st["status"] == "succeeded", st.get("message")
    assert st["master_port"] == offered
    rec = st["preflight"]
    assert rec["status"] == "passed" and rec["by"] == "tui" and not rec["overridden"]
    assert rec["applied"] == {"cluster.master_port": offered}


async def test_override_is_a_second_key_and_the_run_records_it(td_home):
    spec = load_spec(DEMO, ["train.max_steps=3", HARMLESS_FAIL])
    screen = PreflightScreen(spec, DEMO)
    async with screen_host(screen).run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: screen.finished, what="the checks")
        assert [r.id for r in screen.failed()] == ["net.nccl_env"]
        assert not screen.results["net.nccl_env"].fix_set  # no value fixes it
        await pilot.press("f", "l")
        await pilot.pause(0.3)
        assert not runs_made(td_home)
        before = time.time()
        await pilot.press("O")
        assert screen.check_action("launch", ()) is True
        assert "override armed for 1 failure" in str(screen.query_one("#gate-status").render())
        await pilot.press("l")
        await until(pilot, lambda: isinstance(pilot.app.screen, MonitorScreen), 60, "monitor")
        run_id = pilot.app.screen.run_ref
        await until(pilot, lambda: pilot.app.screen.snap is not None, 60, "a snapshot")
    st = wait_for(
        lambda: (s := state_of(td_home, run_id))["status"] in ("succeeded", "failed") and s,
        120,
        "the run's end",
    )
    assert st["status"] == "succeeded", st.get("message")
    rec = st["preflight"]
    assert rec["status"] == "overridden" and rec["overridden"] and rec["by"] == "tui"
    assert [f["id"] for f in rec["failed"]] == ["net.nccl_env"]
    assert "nosuchif9" in rec["failed"][0]["detail"] and rec["failed"][0]["fix"]
    assert before <= rec["overridden_at"] <= rec["at"]


async def test_readonly_hides_launch_and_override():
    spec = load_spec(DEMO, [HARMLESS_FAIL])
    screen = PreflightScreen(spec, DEMO)
    async with screen_host(screen, readonly=True).run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: screen.finished, what="the checks")
        assert screen.check_action("launch", ()) is False
        assert screen.check_action("override", ()) is False
        actions = {a for _, _, a in screen.commands()}
        assert "launch" not in actions and "override" not in actions and "rerun" in actions


async def test_detail_and_fix_sit_below_the_list_at_80x24():
    spec = load_spec(DEMO, ["data.num_workers=64"])  # host.cores warns, with a value fix
    screen = PreflightScreen(spec, DEMO, gate=False)
    async with screen_host(screen).run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: screen.finished, what="the checks")
        table = screen.query_one("#checks", DataTable)
        box = screen.query_one("#check-detail-box")
        assert box.region.y >= table.region.bottom and box.region.bottom <= 23
        assert box.region.width >= 78  # full width, not a side column
        keys = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]
        order = [("fail", "warn", "pass", "skip").index(screen.results[k].status) for k in keys]
        assert order == sorted(order)
        table.move_cursor(row=keys.index("host.cores"))

        def detail() -> str:
            return str(screen.query_one("#check-detail", Static).render())

        # the pane follows the cursor on the next message round, later on a loaded machine
        await until(pilot, lambda: "fix: set data.num_workers" in detail(), what="the detail")
        assert "f applies: data.num_workers =" in detail()
        await pilot.press("f")
        await until(pilot, lambda: screen.finished, what="the checks again")
        assert screen.results["host.cores"].status == "pass"


def test_cli_refuses_a_failing_spec_and_no_preflight_launches_and_is_recorded(td_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = cli(
            "launch",
            str(DEMO),
            "--set",
            "train.max_steps=3",
            "--set",
            f"cluster.master_port={port}",
            "--set",
            HARMLESS_FAIL,
            home=td_home,
            check=False,
        )
    assert p.returncode == 1 and not runs_made(td_home)
    assert "launch refused: 2 preflight check(s) failed" in p.stderr
    assert "[FAIL] Rendezvous port free on this node  (net.port)" in p.stderr
    assert "[FAIL] NCCL variables match this node  (net.nccl_env)" in p.stderr
    assert "fix: set cluster.master_port = " in p.stderr
    assert "--set cluster.master_port=" in p.stderr
    # --no-preflight: the checks are skipped and the run says so
    out, ended = cli_launch(
        "launch", str(DEMO), "--set", "train.max_steps=3", "--set", HARMLESS_FAIL,
        "--no-preflight", home=td_home,
    )  # fmt: skip
    st = state_of(td_home, out["run_id"])
    assert st["status"] == ended["status"] == "succeeded"
    assert st["preflight"]["status"] == "skipped" and st["preflight"]["overridden"]
    assert st["preflight"]["by"] == "cli --no-preflight"
    # a spec that passes is launched and the run keeps the outcome
    out = cli_json("launch", str(DEMO), "--set", "train.max_steps=3", home=td_home)
    rec = state_of(td_home, out["run_id"])["preflight"]
    assert rec["status"] == "passed" and rec["by"] == "cli" and rec["summary"]["fail"] == 0
    wait_for(lambda: state_of(td_home, out["run_id"])["status"] == "succeeded", 120, "the end")


# -- snapshots: fixed checks, no machine facts on screen ---------------------------------------

FIXED = [
    CheckResult(
        "net.port",
        "Rendezvous port free on this node",
        "fail",
        "127.0.0.1:29500 is taken (Address already in use); torchrun would fail with EADDRINUSE",
        "set cluster.master_port = 29517 (free now) or 0 to pick one at launch",
        {"cluster.master_port": 29517},
    ),
    CheckResult(
        "data.rows",
        "Dataset readable and parseable",
        "fail",
        "chat.jsonl: 244 rows (messages); 1 bad row(s):\nchat.jsonl:7: not valid JSON",
        "fix or delete those lines, or set data.skip_bad_rows = true",
        {"data.skip_bad_rows": True},
    ),
    CheckResult(
        "host.cores",
        "Dataloader workers × processes vs CPU cores",
        "warn",
        "2 rank(s) × (1 + 8 worker(s)) = 18 busy processes on 16 cores: workers will fight for CPU",
        "set data.num_workers ≤ 7",
        {"data.num_workers": 7},
    ),
    CheckResult(
        "gpu.count",
        "GPUs visible for the requested processes",
        "pass",
        "2 GPU(s) for 2 process(es) per node",
    ),
    CheckResult(
        "model.files",
        "Model config, tokenizer and weights present",
        "pass",
        "built-in tiny Qwen2, built in code on first use",
    ),
    CheckResult("gpu.nccl", "NCCL available", "pass", "NCCL 2.27.3"),
    CheckResult(
        "host.shm", "/dev/shm large enough for dataloader workers", "skip", "data.num_workers = 0"
    ),
]


def _snapshot_app(monkeypatch) -> App:
    def fixed_checks(ctx, only=None):
        yield from (CheckResult(**r.to_json()) for r in FIXED)

    monkeypatch.setattr("tunedeck.core.preflight.run_checks", fixed_checks)
    spec = load_spec(DEMO, ["cluster.master_port=29500"])
    spec.name = "snap"
    return screen_host(PreflightScreen(spec))


async def _finished(pilot) -> None:
    await until(pilot, lambda: pilot.app.screen.finished, what="the checks")
    await pilot.pause(0.1)


@pytest.mark.parametrize("size", [(80, 24), (160, 48), (120, 40), (240, 67)])
def test_preflight_gate_snapshot(snap_compare, monkeypatch, size):
    assert snap_compare(_snapshot_app(monkeypatch), terminal_size=size, run_before=_finished)
