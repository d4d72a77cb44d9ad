"""Flight Recorder dumps as PyTorch writes them (tests/fixtures/flight/README.md says how each
was made): NCCL on an H200 (torch 2.11), gloo on CPU (torch 2.13)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from tunedeck.core.diagnose import flight

FIX = Path(__file__).resolve().parent / "fixtures" / "flight"


def test_nccl_dumps_of_the_gpu_machine_read_as_pytorch_wrote_them():
    done = flight.load_dump(FIX / "fr_completed.pkl")
    js = flight.load_dump(FIX / "fr_completed.json")
    assert done["version"] == js["version"] == "2.10"
    ops = [flight._entry(done, "0", s).op for s in range(1, 7)]
    assert ops == ["all_reduce"] * 3 + ["broadcast", "all_gather", "all_reduce_barrier"]
    # everything completed (pg_status lags behind the entries): nothing is stuck
    assert flight.analyze({0: done}) == [] and flight.analyze({0: js}) == []


@pytest.mark.parametrize("name", ["fr_pending.pkl", "fr_timeout_rank0"])
def test_a_collective_still_queued_is_named_with_its_sequence_id(name):
    d = flight.load_dump(FIX / name)
    assert flight.rank_of(FIX / name) == (None if name.endswith(".pkl") else 0)
    # alone, the one rank is in its collective and nobody is missing; with a world of two,
    # the rank that left no dump is the one missing
    assert flight.analyze({0: d}) == []
    (v,) = flight.analyze({0: d}, world=[0, 1])
    seq = 7 if name == "fr_pending.pkl" else 2
    assert (v.seq, v.entered, v.missing, v.collective.op) == (seq, [0], [1], "all_reduce")
    f = flight.finding(v)
    assert f.category == "rank_missing_from_collective" and f.rank == 1
    assert f"all_reduce #{seq}" in f.summary


def test_gloo_ranks_name_the_one_held_out(tmp_path):
    for p in FIX.glob("gloo_rank*.pkl"):
        shutil.copy(p, tmp_path / p.name.replace(".pkl", ""))
    dumps, bad = flight.read_folder(tmp_path)
    assert sorted(dumps) == [0, 1] and bad == []
    (v,) = flight.analyze(dumps)
    assert (v.seq, v.entered, v.missing) == (5, [0], [1])
    assert v.last_done[1].op == "broadcast" and v.last_done[1].seq == 4
    f = flight.finding(v, stacks={1: "_test_hang (faults.py:40)"})
    assert f.rank == 1 and "never entered all_reduce #5 sizes [[256]]" in f.summary
    assert any("last completed broadcast #4" in e and "_test_hang" in e for e in f.evidence)
    # the JSON dumps say the same
    js = {r: flight.load_dump(FIX / f"gloo_rank{r}.json") for r in (0, 1)}
    assert [(w.seq, w.missing) for w in flight.analyze(js)] == [(5, [1])]


def test_ranks_that_enter_different_collectives_are_a_mismatch():
    d0 = flight.load_dump(FIX / "gloo_rank0.pkl")
    d1 = flight.load_dump(FIX / "gloo_rank0.pkl")
    d1["entries"][-1] = {**d1["entries"][-1], "input_sizes": [[128]]}
    (v,) = flight.analyze({0: d0, 1: d1})
    assert v.category == "collective_mismatch" and v.missing == []
    assert "[[128]]" in "\n".join(flight.finding(v).evidence)


def test_a_pickle_that_would_run_code_or_is_no_dump_is_refused(tmp_path):
    evil = tmp_path / "rank0"
    evil.write_bytes(pickle.dumps(print))  # a global: find_class refuses it
    with pytest.raises(flight.DumpError, match="rank0.*refusing to load builtins.print"):
        flight.load_dump(evil)
    (tmp_path / "rank1").write_text('{"a": 1}')
    dumps, bad = flight.read_folder(tmp_path)
    assert dumps == {} and len(bad) == 2 and "no version" in bad[1]


@pytest.mark.parametrize("on", [True, False])
def test_the_recorder_is_on_by_default_and_a_switch_turns_it_off(tmp_path, on):
    from tunedeck.core.backends import plan_run
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.spec import load_spec
    from tests.conftest import DEMO

    sets = ['cluster.device="cpu"'] + ([] if on else ["run.flight_recorder=false"])
    run = RunDir(tmp_path / "20990101-000000-demo-abcd")
    _, plan = plan_run(load_spec(DEMO, sets), run)
    env = plan.nodes[0].env
    if on:
        assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        # the watchdog's dump lands where the reader looks: flight/rank<r>
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(run.path / "flight" / "rank")
    else:
        assert not {k for k in env if k.startswith("TORCH_FR_")}
