"""A damaged run directory breaks nothing but itself: every run file × truncated, empty,
garbage and wrong types, under every CLI verb that reads runs, and in the TUI's runs list.

All damaged copies of one real finished demo run sit in one home beside an untouched copy.
Verbs run in-process with TUNEDECK_DEBUG=1, so an exception a verb did not handle itself
escapes to the test instead of becoming the CLI's generic one-line error.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tunedeck.core.rundir import RunDir
from tunedeck.cli.main import main

KINDS = ("truncated", "empty", "garbage", "wrong")
GARBAGE = b"\xff\xfe\x00\x1b[31m\x9b2J not what was written \xe2\x80\xae" * 40

# a rank's stdout: the one rank log every demo run has
RANK_LOG = "logs/node0/*/attempt_0/0/stdout.log"
FILES = (
    "state.json",
    "spec.toml",
    "plan.json",
    "secrets.json",
    "stop.json",
    "run.db",
    "events/rank0.jsonl",
    "logs/agent.log",
    "logs/torchrun-node0.log",
    RANK_LOG,
    "launch.sh",
)
# files whose damage `tunedeck doctor` must name (the others are free text)
CHECKED = (
    "state.json",
    "spec.toml",
    "plan.json",
    "secrets.json",
    "stop.json",
    "run.db",
    "events/rank0.jsonl",
)


def _wrong(rel: str, old: bytes) -> bytes:
    """Well-formed for its format, wrong in its types."""
    if rel == "state.json":  # a vital key: a wrong value in any other reads as missing
        state = json.loads(old)
        state["status"] = ["abc"]
        return json.dumps(state).encode()
    if rel == "spec.toml":
        return b'name = 7\n[train]\nmax_steps = "abc"\nlearning_rate = [1]\n'
    if rel == "plan.json":
        return b'{"nodes": "abc", "nproc_per_node": "2", "nnodes": null}'
    if rel == "secrets.json":
        return b'{"env": ["x"], "nodes": 5, "lists": "y"}'
    if rel == "stop.json":
        return b'{"mode": 3, "t": "soon", "grace_s": "x"}'
    if rel.startswith("events/"):
        bad = {
            "kind": "step",
            "rank": "0",
            "step": "abc",
            "loss": "x",
            "t": "now",
            "tokens_per_s": [],
            "lr": {},
        }
        return (json.dumps(bad) + "\n").encode() * 20 + b'[1, 2]\n"step"\n'
    return b"\x00\x01\x02" + GARBAGE  # free text: binary is its "wrong type"


def _damage(run_dir: Path, rel: str, kind: str) -> Path:
    path = next(run_dir.glob(rel)) if "*" in rel else run_dir / rel
    old = path.read_bytes() if path.exists() else b'{"mode": "graceful", "t": 1}'
    if rel == "run.db":
        for side in ("run.db-wal", "run.db-shm"):
            (run_dir / side).unlink(missing_ok=True)
        if kind == "wrong":  # a real database of some other shape
            path.unlink()
            con = sqlite3.connect(path)
            con.executescript(
                "CREATE TABLE events(x TEXT); INSERT INTO events VALUES ('a');"
                "CREATE TABLE steps(rank TEXT, step TEXT, loss TEXT);"
                "INSERT INTO steps VALUES ('r', 's', 'l');"
            )
            con.commit()
            con.close()
            return path
    data = {
        "truncated": old[: len(old) // 2],
        "empty": b"",
        "garbage": GARBAGE,
        "wrong": _wrong(rel, old),
    }[kind]
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def damaged_home(finished_demo, tmp_path_factory):
    """{(file, kind): run_id} of damaged copies, plus the untouched copy's run id."""
    home0, run_id, _ = finished_demo
    src = home0 / "runs" / run_id
    home = tmp_path_factory.mktemp("damaged-home")
    cases: dict[tuple[str, str], str] = {}
    for i, (rel, kind) in enumerate([(f, k) for f in FILES for k in KINDS] + [("-", "-")]):
        rid = f"20261201-000000-copy{i:02d}-{abs(hash((rel, kind))) % 9999:04x}"
        dst = home / "runs" / rid
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("output"))
        state = json.loads((dst / "state.json").read_text())
        state["run_id"], state["name"] = rid, f"copy-{i}"
        state["created"] += i
        (dst / "state.json").write_text(json.dumps(state))
        if rel != "-":
            _damage(dst, rel, kind)
        cases[(rel, kind)] = rid
    healthy = cases.pop(("-", "-"))
    return home, cases, healthy


def _run(monkeypatch, capsys, home: Path, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("TUNEDECK_DEBUG", "1")
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_ls_lists_every_run_and_names_the_damaged_state(damaged_home, monkeypatch, capsys):
    home, cases, healthy = damaged_home
    rc, out, err = _run(monkeypatch, capsys, home, "ls")
    assert rc == 0, err
    for (rel, kind), rid in cases.items():
        line = next((x for x in out.splitlines() if x.startswith(rid)), None)
        assert line is not None, f"{rel} {kind}: the run is not listed"
        if rel == "state.json":
            assert "damaged: state.json: " in line, line
        else:  # the run's status comes from state.json, which is fine
            assert "succeeded" in line, line
    assert "succeeded" in next(x for x in out.splitlines() if x.startswith(healthy))
    assert "damaged run(s)" in err and "tunedeck doctor" in err
    rc, out, _ = _run(monkeypatch, capsys, home, "ls", "--json")
    listed = {r["run_id"]: r for r in json.loads(out)}
    assert set(listed) == {healthy, *cases.values()}
    assert (
        listed[cases[("state.json", "wrong")]]["message"]
        == "damaged: state.json: status: expected one of pending, running, succeeded, failed, "
        "stopped, queued, got ['abc']"
    )


VERBS = (
    ("status",),
    ("status", "--json"),
    ("metrics",),
    ("metrics", "--json"),
    ("logs",),
    ("diagnose",),
    ("diagnose", "--json"),
    ("stop",),
    ("stacks",),
    ("doctor",),
    ("doctor", "--json"),
)


@pytest.mark.parametrize("rel", FILES)
def test_every_verb_answers_without_a_traceback(damaged_home, monkeypatch, capsys, rel):
    home, cases, healthy = damaged_home
    for kind in KINDS:
        rid = cases[(rel, kind)]
        for verb in VERBS:
            rc, out, err = _run(monkeypatch, capsys, home, verb[0], rid, *verb[1:])
            what = f"{rel} {kind}: tunedeck {' '.join(verb)}"
            assert rc in (0, 1), f"{what} exited {rc}: {err}"
            assert "Traceback" not in out + err, what
            if rc:
                assert err.startswith("tunedeck: ") or verb[0] == "doctor", f"{what}: {err}"
                assert len(err.strip().splitlines()) <= 2, f"{what}: {err}"
            if verb == ("status", "--json"):
                st = json.loads(out)
                assert st["status"] == ("damaged" if rel == "state.json" else "succeeded"), what
        # the spec as a file, as `export` and `preflight` take it
        spec = home / "runs" / rid / "spec.toml"
        for verb in (("export", str(spec)), ("estimate", str(spec))):
            rc, out, err = _run(monkeypatch, capsys, home, *verb)
            assert rc in (0, 1, 2) and "Traceback" not in err, f"{rel} {kind}: {verb}: {err}"
            if rel == "spec.toml" and kind != "truncated":
                assert rc and "spec.toml" in err, f"{kind}: {verb} did not name the file: {err}"
    # the untouched run is untouched by its neighbours
    rc, out, _ = _run(monkeypatch, capsys, home, "status", healthy, "--json")
    assert rc == 0 and json.loads(out)["status"] == "succeeded"
    rc, out, _ = _run(monkeypatch, capsys, home, "metrics", healthy, "--json")
    assert rc == 0 and len(json.loads(out)) >= 10


@pytest.mark.parametrize("rel", CHECKED)
def test_doctor_names_the_damaged_file(damaged_home, monkeypatch, capsys, rel):
    home, cases, healthy = damaged_home
    for kind in KINDS:
        rid = cases[(rel, kind)]
        rc, out, err = _run(monkeypatch, capsys, home, "doctor", rid, "--json")
        bad = {f["file"]: f["problem"] for f in json.loads(out)[0]["files"] if f["problem"]}
        assert rc == 1 and rel in bad, f"{rel} {kind}: doctor found {bad}"
        assert set(bad) == {rel}, f"{rel} {kind}: other files blamed too: {bad}"
    rc, out, _ = _run(monkeypatch, capsys, home, "doctor", healthy)
    assert rc == 0 and "BAD" not in out, out


def test_doctor_over_every_run_prints_only_the_damaged(damaged_home, monkeypatch, capsys):
    home, cases, healthy = damaged_home
    rc, out, _ = _run(monkeypatch, capsys, home, "doctor")
    assert rc == 1
    assert healthy not in out
    for rel in CHECKED:
        assert cases[(rel, "garbage")] in out, rel
    assert f"{len(cases) + 1} run(s) checked" in out


def test_stop_signals_nothing_for_a_damaged_state(damaged_home, monkeypatch, capsys):
    home, cases, _ = damaged_home
    rid = cases[("state.json", "wrong")]
    rc, _, err = _run(monkeypatch, capsys, home, "stop", rid)
    assert rc == 1 and "damaged: state.json" in err and "nothing is signalled" in err
    assert not (home / "runs" / rid / "stop.json").exists()


async def test_tui_lists_damaged_runs_and_their_monitor_says_why(damaged_home, monkeypatch):
    from textual.widgets import DataTable, Static

    from tests.conftest import until
    from tunedeck.tui.app import TunedeckApp
    from tunedeck.tui.screens.monitor import MonitorScreen
    from tunedeck.tui.widgets.progress import ProgressView

    home, cases, healthy = damaged_home
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    app = TunedeckApp(refresh_s=0.2)
    async with app.run_test(size=(160, 60)) as pilot:
        await until(
            pilot,
            lambda: (t := app.screen.query(DataTable)) and t.first().row_count == len(cases) + 1,
            30,
            "every run listed",
        )
        table = app.screen.query_one(DataTable)
        rows = {
            str(table.get_row_at(i)[1]): [str(c) for c in table.get_row_at(i)]
            for i in range(table.row_count)
        }
        for kind in KINDS:
            row = rows[cases[("state.json", kind)]]
            assert "damaged" in row and any("state.json: " in c for c in row), row
        assert "succeeded" in rows[healthy]
        # a monitor on a damaged run says what is wrong instead of "reading…" for ever
        for rel in ("plan.json", "state.json", "run.db", "events/rank0.jsonl"):
            for kind in ("garbage", "wrong"):
                rid = cases[(rel, kind)]
                app.push_screen(MonitorScreen(rid))
                await until(pilot, lambda: isinstance(app.screen, MonitorScreen), 10, "monitor")
                screen = app.screen

                def shown() -> str:
                    views = screen.query(ProgressView)
                    return views.first().text if views else ""

                await until(
                    pilot,
                    lambda: screen.snap is not None or "damaged" in shown(),
                    20,
                    f"{rel} {kind}: the monitor to show something",
                )
                text = shown()
                if rel == "state.json":
                    assert "damaged: state.json" in text, f"{rel} {kind}: {text}"
                else:
                    assert "succeeded" in text, f"{rel} {kind}: {text}"
                log_status = screen.query_one("#log-status", Static)
                await until(
                    pilot,
                    lambda: "reading" not in str(log_status.render()),
                    20,
                    f"{rel} {kind}: the log pane to finish reading",
                )
                await pilot.press("escape")
                await until(pilot, lambda: not isinstance(app.screen, MonitorScreen), 10, "back")


@pytest.mark.parametrize(
    "change, named, vital",
    [
        (
            {"progress": {"step": 3, "loss": "0.5"}},
            "progress.loss: expected a number, got '0.5'",
            False,
        ),
        ({"created": "yesterday"}, "created: expected a number", False),
        ({"status": "bogus"}, "status: expected one of pending, running", True),
        ({"worker_pids": ["x"]}, "worker_pids: expected a list of integers", False),
        ({"progress": {"step": 1.5}}, "progress.step: expected an integer", False),
        ({"ended": float("nan")}, "ended: expected a number", False),
        ({"run_id": None}, "run_id: expected a string", True),
    ],
)
def test_each_mistyped_state_key_is_named(tmp_path, monkeypatch, capsys, change, named, vital):
    """A vital key (run_id, status) of the wrong type makes the run damaged; any other reads
    as missing (the run stays readable and stoppable) and `doctor` names it."""
    from tunedeck.core.store.state import new_state

    home = tmp_path / "home"
    for rid, extra in (("20261201-000000-good-0001", {}), ("20261201-000001-bad-0002", change)):
        (home / "runs" / rid).mkdir(parents=True)
        state = {**new_state(rid, "x", 10), **extra}
        (home / "runs" / rid / "state.json").write_text(json.dumps(state))
    rc, out, _ = _run(monkeypatch, capsys, home, "ls", "--json")
    runs = {r["run_id"]: r for r in json.loads(out)}
    assert rc == 0 and runs["20261201-000000-good-0001"]["status"] == "pending"
    bad = runs["20261201-000001-bad-0002"]
    if vital:
        assert bad["message"].startswith(f"damaged: state.json: {named}")
        return
    assert bad["status"] == "pending" and not bad["message"].startswith("damaged"), bad
    assert bad["step"] in (0, 3) and bad["loss"] is None
    rc, out, _ = _run(monkeypatch, capsys, home, "doctor", "20261201-000001-bad-0002", "--json")
    problems = {f["file"]: f["problem"] for f in json.loads(out)[0]["files"] if f["problem"]}
    assert named in problems.get("state.json", ""), problems


def test_an_empty_state_json_shows_instead_of_hiding_the_run(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "home" / "runs" / "20261201-000000-x-0001"
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_bytes(b"")
    rc, out, _ = _run(monkeypatch, capsys, tmp_path / "home", "ls")
    assert rc == 0 and "damaged: state.json: empty" in out


def test_doctor_tells_a_spec_cut_at_a_line_from_a_whole_one(tmp_path):
    """A spec.toml cut short can still be valid TOML; the keys it lost would come back as
    defaults in a clone or a resume."""
    from tunedeck.core.views.doctor import _spec
    from tunedeck.core.spec import RunSpec

    run = RunDir(tmp_path)
    spec = RunSpec(name="d")
    spec.data.path = str(tmp_path / "chat.jsonl")
    whole = spec.to_toml()
    for text, problem in (
        (whole, None),
        (whole[: whole.index("\n[train]") + 1], "no [env] table"),
        (whole[: whole.index("lora_rank = ") + len("lora_rank = 1")], "no newline"),
    ):
        run.spec.write_text(text)
        got = _spec(run).problem
        assert (got is None) if problem is None else (problem in got), (problem, got)
    swift = RunSpec(name="s", backend="swift").to_toml()  # leaves unset keys out
    run.spec.write_text(swift)
    assert _spec(run).problem is None


def test_doctor_names_an_event_file_cut_between_two_lines(
    finished_demo, tmp_path, monkeypatch, capsys
):
    """A cut that falls on a line boundary leaves a file of whole, valid lines: only run.db's
    record of how far the agent read shows that lines are gone."""
    home0, run_id, _ = finished_demo
    home = tmp_path / "home"
    dst = home / "runs" / run_id
    shutil.copytree(home0 / "runs" / run_id, dst, ignore=shutil.ignore_patterns("output"))
    path = dst / "events" / "rank0.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[: len(lines) // 2])
    path.write_bytes(kept)
    rc, out, _ = _run(monkeypatch, capsys, home, "doctor", run_id, "--json")
    bad = {f["file"]: f["problem"] for f in json.loads(out)[0]["files"] if f["problem"]}
    assert rc == 1 and set(bad) == {"events/rank0.jsonl"}, bad
    assert bad["events/rank0.jsonl"].startswith(f"cut short: {len(kept):,} bytes, but run.db read")
