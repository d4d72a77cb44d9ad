"""End to end in a real terminal (tmux on a server of the test's own): compose the demo in the
form, change two values, pass the preflight gate, launch, watch loss arrive; lose the terminal;
come back in a new one and find the whole run, finished."""

from __future__ import annotations

import json
import sys
import time

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
def test_compose_gate_launch_then_reattach_from_a_new_terminal(td_home, tmux):
    tui = [sys.executable, "-m", "tunedeck.tui"]
    env = {"TUNEDECK_HOME": str(td_home)}
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
    _type(tmux, "one", "C-u", "e2e-demo")
    _goto_and_type(tmux, "one", "max_steps", str(STEPS))

    # the gate: the checklist runs; no failure, so l launches and the monitor opens
    tmux.keys("one", "C-l")
    _screen_has(tmux, "one", "0 failed", timeout=120, what="the checklist")
    tmux.keys("one", "l")
    _screen_has(tmux, "one", "e2e-demo", "running", timeout=120, what="the live monitor")
    _screen_has(tmux, "one", "loss", f"/{STEPS}", timeout=120, what="loss points arriving")
    [run_dir] = list((td_home / "runs").iterdir())
    wait_for(lambda: _steps(run_dir) >= 3, 120, "a few steps on disk")
    at_kill = _steps(run_dir)
    assert at_kill < STEPS, "the run must still be going when the terminal goes"

    # the terminal goes away (an SSH session dropped): the TUI dies, the run does not
    tmux("kill-session", "-t", "one")
    assert not tmux.alive("one")
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "running" and state["name"] == "e2e-demo"
    assert state["preflight"]["status"] == "passed" and state["preflight"]["by"] == "tui"

    # a new terminal: the run is listed; its monitor shows the whole history and the end
    tmux.start("two", tui, size=(120, 40), env=env)
    _screen_has(tmux, "two", run_dir.name, what="the run in the list")
    tmux.keys("two", "Enter")
    _screen_has(
        tmux, "two", "succeeded", f"step {STEPS}/{STEPS}", timeout=240, what="the finished run"
    )
    assert _steps(run_dir) == STEPS
    steps = [
        json.loads(x)["step"]
        for x in (run_dir / "events" / "rank0.jsonl").open()
        if '"kind": "step"' in x
    ]
    assert steps == list(range(1, STEPS + 1))  # nothing lost while no one was watching
    # the chart's step axis reaches the run's end: the whole history is there, not the tail
    _screen_has(tmux, "two", f"all {STEPS} steps", what="the chart over the whole run")
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


def _steps(run_dir) -> int:
    path = run_dir / "events" / "rank0.jsonl"
    if not path.exists():
        return 0
    return sum(1 for x in path.open() if '"kind": "step"' in x)
