"""`tunedeck status` says a run's status once: an ended run's message that already starts with
the status word is shown as it is, any other message beside the status."""

from __future__ import annotations

import pytest

from tests.conftest import cli
from tunedeck.core.rundir import write_json_atomic
from tunedeck.core.store.state import new_state


@pytest.mark.parametrize(
    "status, message, shown",
    [
        ("stopped", "stopped (graceful)", "stopped (graceful)"),
        ("failed", "torchrun exited with code 1", "failed (torchrun exited with code 1)"),
        ("succeeded", "", "succeeded"),
    ],
)
def test_status_line_names_the_status_once(td_home, status, message, shown):
    run_id = "20261203-120000-words-0001"
    run = td_home / "runs" / run_id
    run.mkdir(parents=True)
    state = new_state(run_id, "words", 10)
    state.update(status=status, message=message, ended=state["created"] + 5)
    write_json_atomic(run / "state.json", state)
    out = cli("status", run_id, home=td_home).stdout
    [line] = [ln for ln in out.splitlines() if ln.startswith("status")]
    assert line.split(None, 1)[1] == shown
