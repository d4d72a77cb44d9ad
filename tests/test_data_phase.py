"""The data stage made visible: the tokenizing phase's events and its warning, and the token-
length report preflight shows (core/estimate/lengths.py), on the demo data's tokenizer."""

from __future__ import annotations

import json
import time

import pytest

from tunedeck.core.demo import ensure_tiny_model
from tunedeck.core.estimate.lengths import report, token_lengths
from tunedeck.core.train.data import TokenizeProgress, read_conversations
from tests.conftest import REPO

DATA = REPO / "presets" / "data" / "demo_chat.jsonl"


@pytest.fixture(scope="module")
def model_dir(model_cache):
    return ensure_tiny_model(DATA, cache=model_cache)  # the session's: built once


def test_tokenizing_is_a_phase_with_rate_eta_and_a_timeout_warning(capsys):
    # the trainer's TokenizedDataset calls it every 64 samples (a real run's events are
    # checked in tests/test_stacks.py); here the calls alone, with a 0 s timeout that any
    # tokenizing outlasts, so the warning must come, once
    events = []
    prog = TokenizeProgress(lambda kind, **f: events.append((kind, f)), 0.0, rank=1, every_s=0)
    for done in (0, 64, 128, 130):
        time.sleep(0.01)
        prog(done, 130)
    assert {k for k, _ in events} == {"phase"}
    fields = [f for _, f in events]
    assert all(f["phase"] == "tokenizing" and f["total"] == 130 for f in fields)
    assert [f["done"] for f in fields] == [0, 64, 128, 130]
    assert fields[-1]["rate"] > 0 and fields[1]["eta_s"] >= 0 and fields[-1]["eta_s"] == 0
    err = capsys.readouterr().err
    assert err.count("warning: rank 1: tokenizing 130 samples") == 1
    warned = [f["warning"] for f in fields if "warning" in f]  # the monitor shows it too
    assert len(warned) == 1 and warned[0].startswith("rank 1: tokenizing 130 samples")
    assert "cluster.collective_timeout_s" in err and "pre-tokenise" in err
    # eval after train: the count goes on, the rate stays the stage's
    prog(64, 20)
    assert events[-1][1]["rate"] > fields[-1]["rate"] * 0.5
    # the event is one the schema keeps
    from tunedeck.core.rundir.events import clean_event

    e = clean_event({"t": 1.0, "kind": "phase", "rank": 1, **fields[-1]})
    assert e["phase"] == "tokenizing" and e["done"] == 130


def test_length_report_on_the_demo_data(model_dir):
    texts = ["\n".join(m["content"] for m in c) for c in read_conversations(DATA)]
    lens, exact = token_lengths(str(model_dir / "tokenizer.json"), texts)
    assert exact == len(lens) == 244
    rep = report(lens, max_length=32, batch_size=4, exact=exact)
    s = sorted(lens)
    assert rep.max == s[-1] and rep.p50 == s[121] and rep.p50 <= rep.p90 <= rep.p99 <= rep.max
    assert rep.cut_samples == sum(n > 32 for n in lens) / 244 > 0
    assert 0 < rep.cut_tokens < rep.cut_samples
    assert sum(c for _, c in rep.histogram) == 244 and len(rep.bars()) == len(rep.histogram)
    assert rep.advice_max_length == 64 and "data.max_length=64" in rep.advice()
    assert "over data.max_length 32" in rep.summary()


def test_padding_waste_and_packing_advice():
    # one long sample in every batch of four short ones: most of a padded batch is padding
    lens = [1000, 10, 10, 10] * 50
    rep = report(lens, 2048, batch_size=4)
    assert rep.cut_samples == 0 and rep.pad_waste > 0.6 and rep.advice_packing
    assert "data.packing=true" in rep.advice()
    same = report([100] * 40, 2048, batch_size=4)
    assert same.pad_waste == 0 and not same.advice_packing
    with pytest.raises(ValueError, match="no sample"):
        report([], 512)


def test_past_the_budget_the_rest_is_estimated_from_characters(model_dir):
    texts = [json.dumps({"n": i}) * (1 + i % 7) for i in range(1000)]
    lens, exact = token_lengths(str(model_dir / "tokenizer.json"), texts, budget_s=0)
    assert exact == 200 and len(lens) == 1000  # one chunk, then estimates
    full, _ = token_lengths(str(model_dir / "tokenizer.json"), texts, budget_s=60)
    # the estimate follows the real counts closely on rows of one kind
    assert abs(sum(lens) - sum(full)) / sum(full) < 0.1
    assert "(200 tokenized, the rest estimated" in report(lens, 512, exact=exact).summary()


def test_ms_swift_dataset_entries_are_checked_like_data_path(tmp_path):
    from types import SimpleNamespace

    from tunedeck.core.preflight.inputs import check_dataset_entries
    from tunedeck.core.spec import RunSpec

    spec = RunSpec()
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "part.jsonl").write_text(DATA.read_text())

    def run(*entries, val=()):
        spec.data.datasets, spec.data.val_datasets = list(entries), list(val)
        return check_dataset_entries(SimpleNamespace(spec=spec))

    hub = "AI-ModelScope/alpaca-gpt4-data-en#500"
    r = run(f"{DATA}#100", str(folder), hub)
    assert r.status == "pass", r.detail
    assert f"{DATA}#100: 244 rows (messages)" in r.detail and f"{folder}: 244 rows" in r.detail
    assert f"{hub}: a hub id, not checked offline" in r.detail
    # a missing local file, with its sample suffix, is named with the key it came from
    r = run(hub, val=[str(tmp_path / "gone.jsonl#20")])
    assert r.status == "fail" and "data.val_datasets" in r.detail and "gone.jsonl#20" in r.detail
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\nnot json\n')
    r = run(str(tmp_path / "bad.jsonl"))
    assert r.status == "fail" and "no usable rows" in r.detail and "bad.jsonl:1: " in r.detail
    assert run().status == "skip"
