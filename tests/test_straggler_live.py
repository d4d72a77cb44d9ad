"""A slow rank of the built-in trainer is named as the straggler, under real torchrun."""

from __future__ import annotations

import json

import pytest

from tunedeck.core.store.store import read_findings
from tests.conftest import DEMO, cli, json_docs

pytestmark = pytest.mark.slow


def test_slow_rank_is_flagged_as_straggler(td_home, monkeypatch):
    # rank 1's forward takes 60 ms longer: under DDP its step time hides in everyone's
    # all-reduce, but its forward time (compute_s) does not
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "1:0.06")
    out = cli("launch", str(DEMO), "--wait", "--json", "--set", "train.max_steps=60", home=td_home)
    run_dir = td_home / "runs" / json_docs(out.stdout)[0]["run_id"]
    steps = {
        r: [
            json.loads(x)
            for x in (run_dir / "events" / f"rank{r}.jsonl").open()
            if '"kind": "step"' in x
        ]
        for r in (0, 1)
    }
    slow = sorted(e["compute_s"] for e in steps[1])[30]
    fast = sorted(e["compute_s"] for e in steps[0])[30]
    assert slow > fast + 0.05
    stragglers = [f for f in read_findings(run_dir) if f["category"] == "straggler"]
    assert stragglers and {f["rank"] for f in stragglers} == {1}, read_findings(run_dir)
    assert not [
        f for f in read_findings(run_dir) if f["category"] == "straggler" and f["rank"] == 0
    ]
