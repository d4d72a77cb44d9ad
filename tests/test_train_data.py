"""Built-in trainer data: every row format, label masking, truncation, splits, packing and the
resumable data position. In-process, no torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the train extra is not installed")

from tunedeck.core.demo import ensure_tiny_model, load_tokenizer
from tunedeck.core.spec import DataSpec
from tunedeck.core.train.data import (
    IGNORE,
    Batches,
    Collator,
    FlatCollator,
    PackedDataset,
    TokenizedDataset,
    encode,
    load_datasets,
    make_loader,
    split_rows,
)
from tunedeck.core.train.formats import DataError, read_rows

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
FIX = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_tokenizer(ensure_tiny_model(DATA))


def _labelled(tok, conv, max_length=512, truncation="right") -> list[str]:
    enc = encode(tok, conv, max_length, truncation)
    runs, cur = [], []
    for i, lab in zip(enc["input_ids"], enc["labels"]):
        if lab != IGNORE:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


# -- formats ------------------------------------------------------------------------------


def test_query_response_with_history_and_system(tok):
    rows = read_rows(FIX / "query_response.jsonl")
    assert rows.format == "query_response" and rows.lines == [1, 2]
    conv = rows.conversations[0]
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "user", "assistant"]
    assert conv[0]["content"] == "You are terse." and conv[1]["content"] == "Hi"
    assert _labelled(tok, conv) == ["Hello.<|im_end|>", "5.<|im_end|>"]


def test_alpaca(tok):
    rows = read_rows(FIX / "alpaca.jsonl")
    assert rows.format == "alpaca"
    assert rows.conversations[0] == [
        {"role": "user", "content": "Convert to MiB.\n2 GiB"},
        {"role": "assistant", "content": "2048 MiB."},
    ]
    assert rows.conversations[1][0] == {"role": "system", "content": "Be friendly."}
    assert rows.conversations[1][1]["content"] == "Say hi."  # empty input adds nothing
    assert _labelled(tok, rows.conversations[0]) == ["2048 MiB.<|im_end|>"]


def test_self_cognition_substitutes_name_and_author():
    names = {"model_name": "Decky", "model_author": "the tunedeck team"}
    rows = read_rows(FIX / "self_cognition.jsonl", names=names)
    assert rows.format == "self_cognition"
    assert rows.conversations[0][-1]["content"] == "I am Decky, trained by the tunedeck team."
    assert rows.conversations[1][-1]["content"] == "My name is Decky."
    with pytest.raises(DataError) as e:
        read_rows(FIX / "self_cognition.jsonl", names={"model_name": "Decky"})
    assert str(e.value).startswith(f"{FIX / 'self_cognition.jsonl'}:1: ")
    assert "{{AUTHOR}}" in str(e.value) and "data.model_author" in str(e.value)


def test_messages_json_array_multi_turn(tok):
    rows = read_rows(FIX / "messages.json")
    assert rows.format == "messages" and len(rows.conversations) == 2
    assert _labelled(tok, rows.conversations[0]) == ["Hello.<|im_end|>", "Bye.<|im_end|>"]


def test_explicit_format_mismatch_names_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"query": "a", "response": "b"}\n')
    with pytest.raises(DataError) as e:
        read_rows(p, "alpaca")
    assert str(e.value).startswith(f"{p}:1: ") and '"instruction"' in str(e.value)


def test_undetectable_format_asks_for_data_format(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "hello"}\n')
    with pytest.raises(DataError, match="set data.format"):
        read_rows(p)


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"query": "a"', "not valid JSON"),
        ('{"query": 3, "response": "b"}', '"query" must be a string'),
        ('{"query": "a", "response": "b", "history": [["x"]]}', "history[0]"),
        ('{"response": "b"}', 'missing "query"'),
    ],
)
def test_bad_rows_fail_with_file_line_or_are_skipped(tmp_path, line, problem, capsys):
    good = '{"query": "q", "response": "r"}'
    p = tmp_path / "d.jsonl"
    p.write_text(f"{good}\n{line}\n\n{good}\n")
    with pytest.raises(DataError) as e:
        read_rows(p)
    assert str(e.value).startswith(f"{p}:2: ") and problem in str(e.value)
    rows = read_rows(p, skip_bad_rows=True)
    assert rows.lines == [1, 4] and len(rows.skipped) == 1
    assert rows.skipped[0].startswith(f"{p}:2: ")


def test_skip_bad_rows_warns_once_on_rank0(tmp_path, tok, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text('{"query": "q", "response": "r"}\nnot json\n{"query": "q2", "response": "r2"}\n')
    spec = DataSpec(path=str(p), skip_bad_rows=True)
    train, ev = load_datasets(spec, tok, seed=1, rank=0)
    assert len(train) == 2 and ev is None
    err = capsys.readouterr().err
    assert "skipped 1 bad row" in err and f"{p}:2:" in err


# -- truncation, split, packing -----------------------------------------------------------

LONG = [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "the end"}]


def test_truncation_policies(tok):
    full = encode(tok, LONG, 10_000)
    n = len(full["input_ids"])
    right = encode(tok, LONG, 16, "right")
    left = encode(tok, LONG, 16, "left")
    assert right["input_ids"] == full["input_ids"][:16] and set(right["labels"]) == {IGNORE}
    assert left["input_ids"] == full["input_ids"][n - 16 :]
    assert (
        tok.decode([i for i, lab in zip(left["input_ids"], left["labels"]) if lab != IGNORE])
        == "the end<|im_end|>"
    )  # left keeps the reply
    assert encode(tok, LONG, 16, "drop") is None
    assert encode(tok, LONG, n, "drop") == full


def test_split_is_seeded_and_disjoint():
    rows = [[{"role": "user", "content": str(i)}] for i in range(50)]
    tr, ev = split_rows(rows, 0.2, seed=3)
    assert len(ev) == 10 and len(tr) == 40
    assert {r[0]["content"] for r in tr}.isdisjoint({r[0]["content"] for r in ev})
    assert split_rows(rows, 0.2, seed=3) == (tr, ev)
    assert len(split_rows(rows, 7, seed=3)[1]) == 7  # >= 1: a row count
    with pytest.raises(DataError, match="val_split"):
        split_rows(rows, 50, seed=3)


def test_val_path_overrides_split(tok):
    spec = DataSpec(path=str(DATA), val_path=str(FIX / "alpaca.jsonl"), val_split=0.5)
    train, ev = load_datasets(spec, tok, seed=1)
    assert len(ev) == 2 and len(train) == sum(1 for ln in DATA.read_text().splitlines() if ln)


def test_padded_batch_targets_are_shifted_labels(tok):
    ds = TokenizedDataset(read_rows(DATA).conversations[:4], tok, 128)
    b = Collator(tok.pad_token_id)([ds[0], ds[1]])
    n0 = len(ds[0]["input_ids"])
    assert b["targets"][0, : n0 - 1].tolist() == ds[0]["labels"][1:]
    assert (b["targets"][0, n0 - 1 :] == IGNORE).all() and b["doc_lens"].tolist()[0] == n0


def test_packing_is_document_aware(tok, tmp_path):
    """A flat packed row gives the same loss as the same documents padded: position_ids
    restart per document and attention does not cross documents."""
    from transformers import AutoModelForCausalLM

    from tunedeck.core.train.parallel import CausalLMLoss

    model_dir = ensure_tiny_model(DATA)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="sdpa")
    loss = CausalLMLoss(model).eval()
    ds = TokenizedDataset(read_rows(DATA).conversations[:16], tok, 128)
    packed = PackedDataset(ds, 256, seed=0)
    assert len(packed) < len(ds)
    assert all(sum(len(d["input_ids"]) for d in packed[i]) <= 256 for i in range(len(packed)))
    assert sorted(j for p in packed.packs for j in p) == list(range(len(ds)))
    docs = packed[0]
    assert len(docs) > 1
    flat = FlatCollator()([docs])
    assert flat["input_ids"].shape[0] == 1 and "attention_mask" not in flat
    pad = Collator(tok.pad_token_id)(docs)
    with torch.no_grad():
        a = loss(flat["input_ids"], flat["targets"], position_ids=flat["position_ids"])
        b = loss(pad["input_ids"], pad["targets"], attention_mask=pad["attention_mask"])
        c = loss(flat["input_ids"], flat["targets"])  # no position_ids: attends across docs
    assert torch.allclose(a, b, rtol=1e-4), (a, b)
    assert not torch.allclose(a, c, rtol=1e-4)
    chunked = CausalLMLoss(model, chunk=7).eval()
    with torch.no_grad():
        assert torch.allclose(
            chunked(flat["input_ids"], flat["targets"], position_ids=flat["position_ids"]),
            a,
            rtol=1e-5,
        )


def test_data_position_resumes_exactly(tok):
    ds = TokenizedDataset(read_rows(DATA).conversations[:40], tok, 64)
    kw = dict(batch_size=3, num_workers=0, seed=5, rank=1, world_size=2, pin_memory=False)
    ref = Batches(make_loader(ds, **kw))
    seq = [next(ref)["input_ids"].tolist() for _ in range(16)]  # crosses epoch boundaries
    for cut in (2, 6, 7, 11):
        first = Batches(make_loader(ds, **kw))
        for _ in range(cut):
            next(first)
        pos = first.position()
        again = Batches(make_loader(ds, **kw), pos["epoch"], pos["batches_in_epoch"])
        assert [next(again)["input_ids"].tolist() for _ in range(16 - cut)] == seq[cut:]
