"""The trainer's loss path: chunked linear cross-entropy with gradients made in forward, the
head run on labelled positions only, and the batch → model-input decisions taken on the CPU.
In-process on CPU, no torchrun."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the train extra is not installed")
F = torch.nn.functional

from tunedeck.core.demo import ensure_tiny_model, load_tokenizer
from tunedeck.core.train import ce_kernel
from tunedeck.core.train.data import Collator, FlatCollator, TokenizedDataset
from tunedeck.core.train.formats import read_rows
from tunedeck.core.train.parallel import IGNORE, CausalLMLoss, linear_cross_entropy, rows_per_chunk
from tunedeck.core.train.trainer import forward_inputs

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_CACHE", str(tmp_path_factory.mktemp("cache")))
        path = ensure_tiny_model(DATA)
        return path, load_tokenizer(path)


def _grads(fn, h0, w, autocast):
    """loss, d/dh0, d/dw of fn(h0 * 2) scaled by 0.3 (a non-trivial upstream gradient)."""
    h0.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn(h0 * 2)
    (loss * 0.3).backward()
    return [loss.detach().float(), h0.grad.clone(), w.grad.clone() if w.requires_grad else None]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("head_trains", [False, True])
@pytest.mark.parametrize("chunk", [0, 5, 64])
def test_linear_cross_entropy_matches_autograd(autocast, head_trains, chunk):
    g = torch.Generator().manual_seed(chunk + 2 * head_trains + 4 * autocast)
    h0 = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g).requires_grad_(head_trains)
    t = torch.randint(0, 50, (37,), generator=g)
    t[::4] = IGNORE
    ref = _grads(
        lambda h: F.cross_entropy((h @ w.t()).float(), t, ignore_index=IGNORE, reduction="sum"),
        h0,
        w,
        autocast,
    )
    pos = (t != IGNORE).nonzero().squeeze(1)
    tol = 2e-2 if autocast else 1e-5
    for fn in (
        lambda h: linear_cross_entropy(h, w, t, chunk),
        # only the labelled rows, the caller vouching that all are labelled
        lambda h: linear_cross_entropy(h.index_select(0, pos), w, t[pos], chunk, all_valid=True),
    ):
        got = _grads(fn, h0, w, autocast)
        for a, b in zip(ref, got):
            if a is not None:
                assert b.dtype == a.dtype
                assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol), (a - b).abs().max()


def test_no_grad_and_empty_selection():
    w = torch.randn(50, 16)
    h = torch.randn(4, 16)
    t = torch.tensor([1, 2, IGNORE, 3])
    with torch.no_grad():
        want = F.cross_entropy(h @ w.t(), t, ignore_index=IGNORE, reduction="sum")
        assert torch.allclose(linear_cross_entropy(h, w, t, chunk=3), want, rtol=1e-5)
    h = torch.randn(0, 16, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.zeros(0, dtype=torch.long), all_valid=True)
    loss.backward()
    assert loss.item() == 0.0 and h.grad.shape == (0, 16)


def test_chunks_are_balanced():
    assert rows_per_chunk(8188, 152064) == 2730  # 3 chunks of ≤ 2^29 logits, evenly cut
    assert rows_per_chunk(100, 1000) == 100  # small: one chunk
    assert rows_per_chunk(100, 1000, chunk=7) == 7


def test_forward_inputs_skip_what_the_batch_allows(tiny):
    _, tok = tiny
    ds = TokenizedDataset(read_rows(DATA).conversations[:4], tok, 128)
    cpu = torch.device("cpu")
    padded = Collator(tok.pad_token_id)([ds[0], ds[1], ds[2]])
    assert not padded["attention_mask"].all()
    kw = forward_inputs(padded, cpu)
    assert "attention_mask" in kw and "doc_lens" not in kw
    want = (padded["targets"].flatten() != IGNORE).nonzero().squeeze(1)
    assert torch.equal(kw["label_pos"], want)
    # same length, fully labelled rows: no mask (plain causal attention), no selection
    full = {
        "input_ids": torch.ones(2, 8, dtype=torch.long),
        "targets": torch.ones(2, 8, dtype=torch.long),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
    }
    kw = forward_inputs(full, cpu)
    assert set(kw) == {"input_ids", "targets"}
    flat = FlatCollator()([ds[0], ds[1]])
    assert set(forward_inputs(flat, cpu)) == {"input_ids", "targets", "position_ids", "label_pos"}


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_loss_module_matches_transformers_loss_and_grads(tiny):
    """Our loss (head on labelled rows only, fused chunks) = transformers' own causal-LM loss,
    with the same LoRA gradients; a LoRA-adapted head takes the checkpointed-chunk path and
    agrees too."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    ds = TokenizedDataset(read_rows(DATA).conversations[:6], tok, 128)
    b = Collator(tok.pad_token_id)([ds[i] for i in range(4)])
    labels = torch.where(
        b["attention_mask"].bool(),
        torch.tensor(
            [
                ds[i]["labels"] + [IGNORE] * (b["input_ids"].shape[1] - len(ds[i]["labels"]))
                for i in range(4)
            ]
        ),
        IGNORE,
    )
    n = int((b["targets"] != IGNORE).sum())

    def lora(targets):
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa")
        m = get_peft_model(
            base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
        )
        return m

    def run(m, fn):
        m.zero_grad(set_to_none=True)
        loss = fn(m)
        loss.backward()
        return loss.detach(), {
            k: p.grad.clone()
            for k, p in m.named_parameters()
            if p.requires_grad and "lm_head" not in k
        }

    ref_loss, ref_g = run(
        lora(["q_proj", "v_proj"]),
        lambda m: (
            m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss
        ),
    )
    kw = forward_inputs(b, torch.device("cpu"))
    ours_loss, ours_g = run(
        lora(["q_proj", "v_proj"]), lambda m: CausalLMLoss(m, chunk=5)(**kw) / n
    )
    assert torch.allclose(ours_loss, ref_loss, rtol=1e-5), (ours_loss, ref_loss)
    assert ref_g.keys() == ours_g.keys() and ref_g
    for k in ref_g:
        assert torch.allclose(ours_g[k], ref_g[k], rtol=1e-4, atol=1e-6), k
    # a head that is not a plain Linear (LoRA on lm_head): checkpointed chunks
    m = lora(["q_proj", "v_proj", "lm_head"])
    assert type(m.get_base_model().lm_head) is not torch.nn.Linear
    with torch.no_grad():  # B = 0 where peft's default init would make it a no-op: compare
        for name, p in m.named_parameters():
            if "lm_head" in name and "lora_B" in name:
                p.zero_()
    head_loss, head_g = run(m, lambda m: CausalLMLoss(m, chunk=5)(**kw) / n)
    assert torch.allclose(head_loss, ref_loss, rtol=1e-5)
    for k in ref_g:
        assert torch.allclose(head_g[k], ref_g[k], rtol=1e-4, atol=1e-6), k


# -- the fused chunk math (core/train/ce_kernel.py) ---------------------------------------

HAS_CXX = bool(shutil.which("g++") or shutil.which("c++"))


@pytest.fixture
def fused(monkeypatch):
    """The fused path on CPU (Inductor, as on CUDA), compiled afresh; dynamo's counters read
    before and after."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    if not HAS_CXX:
        pytest.skip("Inductor on CPU needs a C++ compiler (no g++ or c++ on PATH)")
    monkeypatch.setenv("TUNEDECK_COMPILE_BACKEND", "inductor")
    monkeypatch.setenv(ce_kernel.FUSED_ENV, "1")
    torch._dynamo.reset()
    ce_kernel.reset()
    yield lambda: int(counters["stats"]["unique_graphs"])
    ce_kernel.reset()


def _case(seed, n=37, vocab=50, hidden=16, head_trains=True):
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(n, hidden, generator=g, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g).requires_grad_(head_trains)
    t = torch.randint(0, vocab, (n,), generator=g)
    t[::4] = IGNORE
    return h0, w, t


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_chunk_matches_eager_and_autograd(fused, monkeypatch, autocast):
    """Compiled by Inductor: the same loss and d/dh, d/dW as the eager math and as autograd's
    cross-entropy, with IGNORE rows and with all_valid, chunks of 8 leaving a last one of 5;
    compiled once (plus one graph for the loss alone), not per call or per chunk size."""
    h0, w, t = _case(7 + autocast)
    pos = (t != IGNORE).nonzero().squeeze(1)  # 27 rows: chunks of 8, 8, 8, 3
    ref = _grads(
        lambda h: F.cross_entropy((h @ w.t()).float(), t, ignore_index=IGNORE, reduction="sum"),
        h0,
        w,
        autocast,
    )
    cases = (
        lambda h: linear_cross_entropy(h, w, t, chunk=8),
        lambda h: linear_cross_entropy(h.index_select(0, pos), w, t[pos], 8, all_valid=True),
    )
    tol = 2e-2 if autocast else 1e-5
    g0 = fused()
    for fn in cases:
        monkeypatch.setenv(ce_kernel.FUSED_ENV, "0")
        before = fused()
        eager = _grads(fn, h0, w, autocast)
        assert fused() == before  # the switch really keeps the eager math: nothing compiled
        monkeypatch.setenv(ce_kernel.FUSED_ENV, "1")
        got = _grads(fn, h0, w, autocast)
        for a, b, c in zip(ref, eager, got):
            assert c.dtype == a.dtype
            assert torch.allclose(a.float(), c.float(), rtol=tol, atol=tol), (a - c).abs().max()
            # the same math in other kernels: equal here, far closer than to fp32 autograd
            close = 1e-3 if autocast else 1e-5
            assert torch.allclose(b.float(), c.float(), rtol=close, atol=close), (b - c).abs().max()
    assert ce_kernel._failed is None
    graphs = fused() - g0
    assert 1 <= graphs <= 4, graphs  # IGNORE masking or not, each 1 graph (+1 for 1-row chunks)
    for _ in range(3):  # the same shapes again, and other row counts: no new graph
        for fn in cases:
            _grads(fn, h0, w, autocast)
        _grads(lambda h: linear_cross_entropy(h[:30], w, t[:30], chunk=7), h0, w, autocast)
    assert fused() - g0 == graphs
    with torch.no_grad():  # the loss alone: its own graph, the same value
        want = F.cross_entropy(h0 @ w.t(), t, ignore_index=IGNORE, reduction="sum")
        assert torch.allclose(linear_cross_entropy(h0, w, t, chunk=8), want, rtol=1e-5)
    assert fused() - g0 == graphs + 1


def test_fused_chunk_compile_failure_falls_back_once(fused, monkeypatch, capsys):
    """A backend that raises: the loss is still right (eager), one warning, and no second
    attempt for the rest of the process."""
    from torch._dynamo import register_backend

    calls = []

    def broken(gm, example_inputs):
        calls.append(1)
        raise RuntimeError("no compiler here")

    register_backend(name="tunedeck_test_broken", compiler_fn=broken)
    monkeypatch.setenv("TUNEDECK_COMPILE_BACKEND", "tunedeck_test_broken")
    h0, w, t = _case(3, head_trains=False)
    ref = _grads(
        lambda h: F.cross_entropy((h @ w.t()).float(), t, ignore_index=IGNORE, reduction="sum"),
        h0,
        w,
        False,
    )
    for _ in range(3):
        got = _grads(lambda h: linear_cross_entropy(h, w, t, chunk=8), h0, w, False)
        assert torch.allclose(ref[0], got[0], rtol=1e-5)
        assert torch.allclose(ref[1], got[1], rtol=1e-5, atol=1e-6)
    assert len(calls) == 1 and "no compiler here" in ce_kernel._failed
    err = capsys.readouterr().err
    assert err.count("fused output-head loss did not compile") == 1, err


def test_fused_chunk_follows_train_compile_unless_turned_off(monkeypatch):
    """On where the run compiles its layers (compile_wanted's rule: CUDA, or CPU under
    TUNEDECK_COMPILE_BACKEND); train.compile = false keeps the loss eager too, and
    TUNEDECK_FUSED_CE=0 turns it off anywhere."""
    monkeypatch.delenv("TUNEDECK_COMPILE_BACKEND", raising=False)
    monkeypatch.delenv(ce_kernel.FUSED_ENV, raising=False)
    ce_kernel.reset()
    try:
        assert ce_kernel.fused_wanted(torch.device("cuda"))
        assert not ce_kernel.fused_wanted(torch.device("cpu"))
        ce_kernel.follow_compile(False)
        assert not ce_kernel.fused_wanted(torch.device("cuda"))
        ce_kernel.follow_compile(True)
        monkeypatch.setenv("TUNEDECK_COMPILE_BACKEND", "eager")
        assert ce_kernel.fused_wanted(torch.device("cpu"))
        monkeypatch.setenv(ce_kernel.FUSED_ENV, "0")
        assert not ce_kernel.fused_wanted(torch.device("cpu"))
        assert not ce_kernel.fused_wanted(torch.device("cuda"))
    finally:
        ce_kernel.reset()
