"""End to end in a real terminal (tmux on a server of the test's own), one real run of the CPU
demo all the way: compose it in the form, change two values, save it over an older copy (the
confirmation names the file), pass the preflight gate, launch, watch loss arrive, stop it (the
monitor says `stopping` until the stop is recorded, then `stopped (graceful)`), resume it from
its checkpoint (the chart joined to the run it resumed), lose the terminal, come back in a new
one and find the whole resumed run, finished.

Every wait is on what the screen or the run directory says, never on a time: rank 0 is slowed
by a fixed amount per step (TUNEDECK_TEST_SLOW_RANK), so the run is still going when the test
acts on it on an idle machine as on a loaded one."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO, wait_for

STEPS = 40


def _screen_has(tmux, name, *words, timeout=60.0, what=""):
    def ok():
        text = tmux.screen(name)
        return all(w in text for w in words) and text

    try:
        return wait_for(ok, timeout, what or " and ".join(words))
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- screen ---\n{tmux.screen(name)}") from None


@pytest.mark.slow
def test_compose_save_launch_stop_resume_then_reattach(td_home, tmux, request):
    tui = [sys.executable, "-m", "tunedeck.tui"]
    # the user's home, where ctrl+s proposes to save a preset: a short path, so the
    # confirmation shows it on one line of the terminal
    user = Path(tempfile.mkdtemp(prefix="td-home-"))
    request.addfinalizer(lambda: shutil.rmtree(user, ignore_errors=True))
    older = user / "demo.toml"
    older.write_text("# an older copy of the demo\n")
    env = {
        "TUNEDECK_HOME": str(td_home),
        "HOME": str(user),
        "TUNEDECK_TEST_SLOW_RANK": "0:0.3",  # ~12 s of steps: time to stop it mid-run
    }
    tmux.start("one", tui, size=(120, 40), env=env)
    _screen_has(tmux, "one", "No runs yet", what="the empty runs list")

    # open the demo preset in the form
    tmux.keys("one", "o")
    _screen_has(tmux, "one", "Open a spec file", what="the path prompt")
    tmux.keys("one", str(DEMO), "Enter")
    _screen_has(tmux, "one", "compose", "demo.toml", what="the form")
    _screen_has(
        tmux,
        "one",
        "── node 0 ·",
        "export TUNEDECK_RUN_ID",
        timeout=60,
        what="the preview's command",
    )
    # two values changed by keys: the name (focused first) and max_steps (ctrl+g, its key)
    _type(tmux, "one", "C-u")
    wait_for(lambda: _field_value(tmux, "one", "name") == "", 30, "the name cleared")
    _type(tmux, "one", "e2e-demo")
    wait_for(lambda: _field_value(tmux, "one", "name") == "e2e-demo", 30, "the new name")
    _goto_and_type(tmux, "one", "max_steps", str(STEPS))

    # save: a shipped preset is proposed in the user's home; the file there is asked about
    tmux.keys("one", "C-s")
    _screen_has(tmux, "one", "Save the spec as TOML", str(older), what="the proposed path")
    tmux.keys("one", "Enter")
    _screen_has(tmux, "one", "Overwrite it?", str(older), what="the overwrite confirmation")
    tmux.keys("one", "y")
    _screen_has(tmux, "one", "saved", what="the save's notice")
    saved = older.read_text()
    assert 'name = "e2e-demo"' in saved and f"max_steps = {STEPS}" in saved
    assert DEMO.read_text().count('name = "demo"') == 1  # the shipped preset untouched

    # the gate: the checklist runs; no failure, so l launches and the monitor opens
    tmux.keys("one", "C-l")
    _screen_has(tmux, "one", "0 failed", timeout=120, what="the checklist")
    tmux.keys("one", "l")
    _screen_has(tmux, "one", "e2e-demo", "running", timeout=120, what="the live monitor")
    _screen_has(tmux, "one", "loss", f"/{STEPS}", timeout=120, what="loss points arriving")
    [parent_dir] = list((td_home / "runs").iterdir())
    wait_for(lambda: _steps(parent_dir) >= 3, 120, "a few steps on disk")

    # stop: `stopping` while the ranks finish their step and save, then the recorded end
    tmux.keys("one", "s")
    _screen_has(tmux, "one", "Stop ", "Ranks finish their step", what="the stop question")
    tmux.keys("one", "y")
    _screen_has(tmux, "one", "stopping (graceful)", timeout=60, what="the stopping state")
    _screen_has(tmux, "one", "stopped (graceful)", timeout=120, what="the recorded stop")
    stopped_at = _steps(parent_dir)
    assert 3 <= stopped_at < STEPS
    state = json.loads((parent_dir / "state.json").read_text())
    assert state["status"] == "stopped" and state["name"] == "e2e-demo"
    assert state["preflight"]["status"] == "passed" and state["preflight"]["by"] == "tui"

    # resume from the list: through the gate again, a new run joined to its parent
    tmux.keys("one", "Escape")
    # the list's own row says stopped and its footer offers R (keys sent before Esc is read
    # would make it alt+key). Not just "stopped" anywhere: the stop's toast says "stopped"
    # too, and the monitor's title has the id and status
    _list_shows(tmux, "one", parent_dir.name, "stopped")
    tmux.keys("one", "R")
    _screen_has(tmux, "one", "0 failed", timeout=120, what="the resume's checklist")
    tmux.keys("one", "l")
    wait_for(lambda: len(list((td_home / "runs").iterdir())) == 2, 60, "the resumed run")
    [child_dir] = [d for d in (td_home / "runs").iterdir() if d != parent_dir]
    _screen_has(
        tmux, "one", child_dir.name, "before the resume", timeout=120, what="the joined chart"
    )
    wait_for(lambda: _steps(child_dir) >= 1, 120, "the resumed run's first steps")

    # the terminal goes away (an SSH session dropped): the TUI dies, the run does not
    tmux("kill-session", "-t", "one")
    assert not tmux.alive("one")
    assert json.loads((child_dir / "state.json").read_text())["status"] == "running"

    # a new terminal: the run is listed; its monitor shows the whole history and the end
    # 160 columns: the title holds the settings line and the run id whole
    tmux.start("two", tui, size=(160, 48), env=env)
    _screen_has(tmux, "two", child_dir.name, what="the run in the list")
    tmux.keys("two", "Enter")
    _screen_has(
        tmux, "two", "succeeded", f"step {STEPS}/{STEPS}", timeout=240, what="the finished run"
    )
    _screen_has(tmux, "two", child_dir.name, what="the resumed run's monitor")
    steps = [
        json.loads(x)["step"]
        for x in (child_dir / "events" / "rank0.jsonl").open()
        if '"kind": "step"' in x
    ]
    # it went on after the checkpoint the stop wrote, to the end, nothing lost unwatched
    assert steps == list(range(steps[0], STEPS + 1)) and steps[0] <= stopped_at + 1
    # the chart spans parent and child: the parent's steps drawn before the resume
    _screen_has(tmux, "two", f"all {STEPS} steps", "before the resume", what="the chart, joined")
    tmux.keys("two", "q")


def _type(tmux, name: str, *keys: str) -> None:
    """One key (or word) per write, as a person types: a control key and text written in
    one burst reach the TUI as one read, and the text after ctrl+u was dropped."""
    for k in keys:
        tmux.keys(name, k)
        time.sleep(0.15)


def _field_value(tmux, name: str, key: str) -> str | None:
    for ln in tmux.screen(name).splitlines():
        words = ln.split("│")[0].split()  # the form's pane, not the preview beside it
        if words[:1] == [key]:
            return words[1] if len(words) > 1 else ""
    return None


def _goto_and_type(tmux, name: str, field: str, value: str) -> None:
    """ctrl+g to the field, then its new value. Keys typed while the prompt is still closing
    go to the prompt, as they would for a person typing ahead on a loaded machine, so each
    step waits for what the screen says before the next: the prompt gone, the field cleared."""
    key = f"train.{field}"
    for _ in range(3):
        tmux.keys(name, "C-g")
        _screen_has(tmux, name, "Go to the field", what="the go-to prompt")
        _type(tmux, name, field, "Enter")
        wait_for(lambda: "Go to the field" not in tmux.screen(name), 30, "the prompt to close")
        _type(tmux, name, "C-u")
        try:
            wait_for(lambda: _field_value(tmux, name, key) == "", 10, f"{key} cleared")
        except AssertionError:
            continue  # the focus had not reached the field yet: go to it again
        _type(tmux, name, value)
        wait_for(lambda: _field_value(tmux, name, key) == value, 30, "the edited field")
        return
    raise AssertionError(f"ctrl+g never put the focus in {key}\n{tmux.screen(name)}")


def _list_shows(tmux, name: str, run_id: str, status: str, timeout: float = 60.0) -> None:
    """Wait for the runs list with `run_id`'s row (the line that starts with the id: id,
    name, ranks, status, step...) in `status`, and its footer's R key."""

    def ok():
        text = tmux.screen(name)
        rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] == [run_id]]
        return "R Resume" in text and any(status in row for row in rows)

    try:
        wait_for(ok, timeout, f"the runs list showing {run_id} {status}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- screen ---\n{tmux.screen(name)}") from None


def _steps(run_dir) -> int:
    path = run_dir / "events" / "rank0.jsonl"
    if not path.exists():
        return 0
    return sum(1 for x in path.open() if '"kind": "step"' in x)
