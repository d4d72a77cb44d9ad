"""run.db's one owner: the agent's Store ingests each event once, by byte offset; a viewer's
read-only Store sees what was ingested plus what was not yet; a finding is stored once."""

from __future__ import annotations

import json

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.rundir import RunDir
from tunedeck.core.store.store import Store


def _append(path, *events):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def test_events_ingested_once_and_readers_see_the_rest(tmp_path):
    run = RunDir(tmp_path)
    _append(run.event_file(0), {"kind": "step", "rank": 0, "step": 1, "loss": 2.0})
    _append(run.event_file(1), {"kind": "step", "rank": 1, "step": 1, "loss": 2.0})
    _append(run.probe_file(1), {"kind": "data_wait", "wait_s": 0.5, "n": 3})  # no rank
    agent = Store(run, write=True)
    assert len(agent.ingest()) == 2 and agent.ingest() == []
    [probe] = agent.ingest_probe()
    assert probe["rank"] == 1 and agent.ingest_probe() == []
    # not ingested yet (the agent is behind, or gone): readers still get it, from the file
    _append(
        run.event_file(0),
        {"kind": "step", "rank": 0, "step": 2, "loss": 1.5},
        {"kind": "end", "rank": 0, "step": 2},
    )
    with Store(run) as viewer:
        assert [e["step"] for e in viewer.events("step", rank=0)] == [1, 2]
        assert len(viewer.events()) == 5
    agent.close()
    # a new agent life (a restart) resumes from the stored offsets
    again = Store(run, write=True)
    assert [e["kind"] for e in again.ingest()] == ["step", "end"]
    again.close()


def test_a_finding_without_a_rank_is_stored_once(tmp_path):
    store = Store(RunDir(tmp_path), write=True)
    f = Finding("ib_missing", "info", "no InfiniBand", "cause", "fix", t=1.0)
    assert store.save_finding(f) and not store.save_finding(f)
    g = Finding("oom_gpu", "error", "OOM", "cause", "fix", rank=1, t=2.0)
    assert store.save_finding(g) and not store.save_finding(g)
    store.close()
    with Store(tmp_path) as viewer:
        assert [x["category"] for x in viewer.findings()] == ["ib_missing", "oom_gpu"]
        assert [x["category"] for x in viewer.findings("oom_gpu")] == ["oom_gpu"]
        assert viewer.findings()[0]["rank"] is None
