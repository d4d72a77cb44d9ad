"""The built-in trainer's fast path on CPU: length buckets, fixed-length packed rows, packed
(document-aware) attention equal to per-document attention, compile phases and the recompile
count under dynamo (its "eager" backend: dynamo's tracing and guards without a C compiler), and
the fallback to eager when compiling fails (real torchrun runs)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
import torch

from tunedeck.core.estimate.resolve import free_port
from tunedeck.core.rundir.events import read_events
from tunedeck.core.train.data import IGNORE, Collator, FlatCollator, PackedDataset
from tunedeck.core.train.fastpath import (
    LayerCompiler,
    bucket_length,
    is_compile_error,
    length_buckets,
    packed_attention,
    reference_packed_attention,
    use_packed_attention,
)
from tunedeck.core.train.parallel import CausalLMLoss
from tunedeck.core.train.trainer import forward_inputs
from tests.conftest import make_run_dir, trainer_torchrun_argv

REPO = Path(__file__).resolve().parents[1]


def test_length_buckets():
    assert length_buckets(2048) == [128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    assert length_buckets(1000) == [128, 192, 256, 384, 512, 768, 1000]
    assert length_buckets(100) == [100]
    b = length_buckets(2048)
    assert [bucket_length(n, b) for n in (1, 128, 129, 700, 1537, 2048)] == [
        128,
        128,
        192,
        768,
        2048,
        2048,
    ]


def _samples(n, seed=0, max_len=2048, labelled_from=0.5):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = max(4, min(max_len, int(rng.lognormvariate(5.8, 0.8))))
        ids = [rng.randrange(1, 97) for _ in range(k)]
        cut = int(k * labelled_from)
        out.append({"input_ids": ids, "labels": [IGNORE] * cut + ids[cut:]})
    return out


def test_bucketed_collator_keeps_shapes_few():
    samples = _samples(400)
    coll = Collator(0, length_buckets(2048))
    shapes = {tuple(coll(samples[i : i + 4])["input_ids"].shape) for i in range(0, 400, 4)}
    assert {s[1] for s in shapes} <= set(length_buckets(2048))
    assert len(shapes) <= len(length_buckets(2048))
    plain = {tuple(Collator(0)(samples[i : i + 4])["input_ids"].shape) for i in range(0, 400, 4)}
    assert len(plain) > 2 * len(shapes)  # what compiling each batch's own length would cost
    b = coll(samples[:4])
    for r, s in enumerate(samples[:4]):  # padding carries no loss and is masked
        k = len(s["input_ids"])
        assert b["attention_mask"][r, :k].all() and not b["attention_mask"][r, k:].any()
        assert (b["targets"][r, k - 1 :] == IGNORE).all()


class _Base:
    def __init__(self, samples):
        self.samples, self.tokenizer = samples, None

    def __len__(self):
        return len(self.samples)


def test_packed_rows_have_one_length():
    samples = _samples(300, max_len=512)
    packs = PackedDataset(_Base(samples), 512, seed=0)
    coll = FlatCollator(pad_id=0, fixed_len=4 * 512, max_doc=512)
    for i in range(0, len(packs) - 4, 4):
        items = [packs[j] for j in range(i, i + 4)]
        b = coll(items)
        docs = [d for it in items for d in it]
        assert b["input_ids"].shape == (1, 4 * 512)
        cu = b["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == 4 * 512
        seg = [y - x for x, y in zip(cu, cu[1:])]
        assert seg[: len(docs)] == [len(d["input_ids"]) for d in docs]
        assert all(0 < k <= 512 for k in seg)  # fillers within a document's bound
        assert b["doc_lens"].tolist() == [len(d["input_ids"]) for d in docs]
        real = sum(seg[: len(docs)])
        assert (b["targets"][0, real:] == IGNORE).all()  # fillers carry no loss
        pos = b["position_ids"][0]
        for s, k in zip(cu, seg):
            assert pos[s : s + k].tolist() == list(range(k))


def test_reference_packed_attention_is_per_document_attention():
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 5, 12, 20], dtype=torch.int32)  # a zero-length document too
    q, k, v = torch.randn(20, 4, 8), torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    got = reference_packed_attention(q, k, v, cu, None)
    for s, e in ((0, 5), (5, 12), (12, 20)):
        want = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1),
            k[s:e].transpose(0, 1),
            v[s:e].transpose(0, 1),
            is_causal=True,
            enable_gqa=True,
        ).transpose(0, 1)
        assert torch.allclose(got[s:e], want, atol=1e-5)
    out, w = packed_attention(
        None,
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        None,
        cu_seq_lens_q=cu,
        max_length_q=8,
    )
    assert w is None and torch.allclose(out[0], got)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
@pytest.mark.parametrize("kcat", [False, True])
def test_packed_attention_in_the_model_equals_padded_loss(monkeypatch, kcat):
    """A model switched to packed attention, on one fixed-length packed row, gives the loss
    and LoRA gradients of the same documents padded (no T×T mask is built); so does one whose
    attention blocks and MLPs run kcat's widened forwards."""
    from tunedeck.core.train.lora_fused import fuse_lora

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "sdpa"

    def model():
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg)
        return get_peft_model(
            m, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
        )

    docs = _samples(5, seed=3, max_len=60)
    cpu = torch.device("cpu")
    padded = Collator(0)(docs)
    flat = FlatCollator(0, fixed_len=sum(len(d["input_ids"]) for d in docs) + 37, max_doc=60)(
        [docs]
    )

    def run(m, b, packed_max):
        m.zero_grad(set_to_none=True)
        loss = CausalLMLoss(m)(**forward_inputs(b, cpu, packed_max))
        loss.backward()
        return loss.detach(), {k: p.grad for k, p in m.named_parameters() if p.requires_grad}

    ref_loss, ref_g = run(model(), padded, 0)
    m = model()
    if kcat:
        monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
        monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "kcat")
        assert fuse_lora(m) == 14
        assert sum(hasattr(b, "_tunedeck_w_q_proj") for b in m.modules()) == 2
    use_packed_attention(m)
    loss, g = run(m, flat, 60)
    assert torch.allclose(loss, ref_loss, rtol=1e-5), (loss, ref_loss)
    for k in ref_g:
        assert (g[k] - ref_g[k]).norm() <= 1e-5 * ref_g[k].norm(), k  # fp32, another order


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_fused_lora_equals_peft(monkeypatch):
    """The fused LoRA linear gives peft's loss and gradients (biased q/k/v projections too),
    under bf16 autocast as well; with the traced epilogues a layer with dropout keeps peft's
    own forward."""
    from lora_replay import loss_and_grads as run
    from lora_replay import tiny_peft as model

    from tunedeck.core.train.lora_fused import eligible, fuse_lora

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert fuse_lora(model(), cpu) == 0  # CPU: peft's own layers unless asked
    assert fuse_lora(model(), cuda) == 14  # CUDA: on by default (no GPU needed to swap)
    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "0")
    assert fuse_lora(model(), cuda) == 0
    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")

    # fp32: the same numbers; bf16: the same up to rounding in another order; the adapter
    # added in the frozen GEMM's epilogue (the default), out of place, or by the opaque ops
    cases = ((False, 1e-5, "1"), (True, 0.1, "1"), (False, 1e-5, "0"))
    cases += ((False, 1e-5, "op"), (True, 0.1, "op"), (False, 1e-5, "after"))
    cases += ((False, 1e-5, "kcat"), (True, 0.1, "kcat"), (False, 1e-5, "kcat-mlp"))
    for autocast, tol, epilogue in cases:
        monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", epilogue)
        ref_loss, ref_g = run(model(), autocast=autocast)
        m = model()
        assert fuse_lora(m) == 14  # 7 projections x 2 layers
        loss, g = run(m, autocast=autocast)
        assert torch.allclose(loss, ref_loss, rtol=tol), (loss, ref_loss)
        for k in ref_g:  # bf16 rounds in another order: compare as vectors
            assert (g[k] - ref_g[k]).norm() <= tol * ref_g[k].norm(), k
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "OP")  # a typo is named, not ignored
    with pytest.raises(ValueError, match="TUNEDECK_LORA_EPILOGUE='OP'"):
        fuse_lora(model())
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "1")  # dropout lives in the opaque ops only
    assert fuse_lora(model(dropout=0.1)) == 0
    monkeypatch.delenv("TUNEDECK_LORA_EPILOGUE")
    assert all(eligible(mod) for mod in model(dropout=0.1).modules() if hasattr(mod, "lora_A"))


def test_fused_lora_dropout_is_peft_dropout_with_the_same_mask(monkeypatch):
    """With dropout, the fused layers (16-bit base, "op", "after" and "kcat") give the loss and
    gradients peft's layers give when peft drops the same elements; in eval mode nothing is
    dropped; the masks keep 1 - p of the elements."""
    from lora_replay import loss_and_grads, record_masks, replaying, tiny_peft

    from tunedeck.core.train import lora_fused

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    masks = record_masks(monkeypatch)
    for epilogue in ("op", "after", "kcat"):
        monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", epilogue)
        masks.clear()
        fused = tiny_peft(dropout=0.3)
        assert lora_fused.fuse_lora(fused) == 14
        loss, grads = loss_and_grads(fused)
        assert len(masks) == 14
        kept = torch.cat([m.flatten() for m in masks]).float().mean().item()
        assert abs(kept - 0.7) < 0.03, kept
        ref_loss, ref_grads = loss_and_grads(replaying(tiny_peft(dropout=0.3), masks, 0.3))
        assert torch.allclose(loss, ref_loss, rtol=1e-5), (loss, ref_loss)
        for k in ref_grads:
            assert (grads[k] - ref_grads[k]).norm() <= 1e-5 * ref_grads[k].norm(), k
        fused.eval()
        ref = tiny_peft(dropout=0.3).eval()
        assert torch.allclose(loss_and_grads(fused)[0], loss_and_grads(ref)[0], rtol=1e-5)


def test_kcat_layers_follow_the_optimizer_and_save_what_peft_saves(monkeypatch):
    """TUNEDECK_LORA_EPILOGUE=kcat: each gated MLP and attention block runs its adapters as extra
    K columns of its frozen GEMMs (gate and up one GEMM, q, k and v one), the frozen weights
    views of the wide buffers, the B blocks copied in before each forward; three fused-AdamW
    steps give peft's losses and adapters, the state dict holds peft's keys and values. A block
    with dropout keeps the per-linear ops; kcat-mlp leaves attention to them."""
    from lora_replay import loss_and_grads, tiny_peft, train_alike

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "kcat")
    ref, fused = tiny_peft(), tiny_peft()
    assert fuse_lora(fused) == 14
    mlps = [m for m in fused.modules() if hasattr(m, "_tunedeck_w_gate_proj")]
    attns = [m for m in fused.modules() if hasattr(m, "_tunedeck_w_q_proj")]
    assert len(mlps) == len(attns) == 2
    for mlp in mlps:  # no second copy of a frozen weight
        gu, dn = mlp._tunedeck_w_gate_proj, mlp._tunedeck_w_down_proj
        assert mlp.gate_proj.base_layer.weight.data_ptr() == gu.data_ptr()
        assert mlp.up_proj.base_layer.weight.data_ptr() == gu[gu.shape[0] // 2 :].data_ptr()
        assert mlp.down_proj.base_layer.weight.data_ptr() == dn.data_ptr()
    for at in attns:
        qkv, q_out = at._tunedeck_w_q_proj, at.q_proj.base_layer.weight.shape[0]
        assert at.v_proj.base_layer.weight.data_ptr() == qkv[q_out + 32 :].data_ptr()  # k: 32
        assert at.o_proj.base_layer.weight.data_ptr() == at._tunedeck_w_o_proj.data_ptr()
    dropped = tiny_peft(dropout=0.1)
    fuse_lora(dropped)
    assert not any(hasattr(m, "_tunedeck_w_gate_proj") for m in dropped.modules())
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "kcat-mlp")
    fuse_lora(mlp_only := tiny_peft())
    assert [hasattr(m, "_tunedeck_w_gate_proj") for m in mlp_only.modules()].count(True) == 2
    assert not any(hasattr(m, "_tunedeck_w_q_proj") for m in mlp_only.modules())
    x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), fused.disable_adapter(), ref.disable_adapter():  # peft's own path
        assert torch.allclose(fused(input_ids=x).logits, ref(input_ids=x).logits, atol=1e-5)
    last = train_alike(ref, fused, 3)
    assert last < loss_and_grads(tiny_peft())[0] - 0.1  # the steps did train


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_kcat_widens_llama_and_mistral_blocks_as_peft_computes_them(monkeypatch, arch):
    """kcat's attention forward follows each architecture's own (Llama: no bias, no window;
    Mistral: the config's window): both blocks widened, peft's loss and gradients in fp32."""
    from lora_replay import loss_and_grads, tiny_peft

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "kcat")
    m = tiny_peft(arch=arch)
    assert fuse_lora(m) == 14
    assert sum(hasattr(b, "_tunedeck_w_q_proj") for b in m.modules()) == 2
    assert sum(hasattr(b, "_tunedeck_w_gate_proj") for b in m.modules()) == 2
    loss, g = loss_and_grads(m)
    ref_loss, ref_g = loss_and_grads(tiny_peft(arch=arch))
    assert torch.allclose(loss, ref_loss, rtol=1e-5), (loss, ref_loss)
    for k in ref_g:
        assert (g[k] - ref_g[k]).norm() <= 1e-5 * ref_g[k].norm(), k


def test_fused_lora_dropout_draws_from_the_random_stream_as_peft_does(monkeypatch):
    """Backward draws the forward's masks again from the generator state the forward returned
    and puts the generator back: the random stream after a step is the forward's, and the
    same as peft's layers leave it. Under gradient checkpointing the recomputed forward draws
    the first forward's masks (checkpoint puts the generator back, and the op draws from it):
    the gradients are those of the same step without checkpointing."""
    from lora_replay import tiny_peft

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    streams, grads = [], []
    for fused, checkpointed in ((False, False), (True, False), (True, True)):
        m = tiny_peft(dropout=0.3)
        if checkpointed:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        if fused:
            assert fuse_lora(m) == 14
        torch.manual_seed(5)
        loss = m(input_ids=x, labels=x).loss
        after_forward = torch.get_rng_state()
        loss.backward()
        assert torch.equal(torch.get_rng_state(), after_forward), (fused, checkpointed)
        streams.append(torch.rand(4))
        grads.append({k: p.grad for k, p in m.named_parameters() if p.requires_grad})
    assert all(torch.equal(streams[0], s) for s in streams)
    for k in grads[1]:
        assert torch.equal(grads[1][k], grads[2][k]), k


def test_compile_errors_are_told_from_model_errors():
    import torch._dynamo

    def broken(gm, example_inputs):
        raise ValueError("no")

    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.sin(x) + 1, backend=broken)
    with pytest.raises(Exception) as got:
        f(torch.randn(3))
    assert is_compile_error(got.value)
    assert not is_compile_error(RuntimeError("CUDA out of memory"))
    assert not is_compile_error(ValueError("shape mismatch"))
    torch._dynamo.reset()


class _Layer(torch.nn.Module):  # not torch.nn's own code, which dynamo does not trace
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))


class _Events:
    def __init__(self):
        self.got = []

    def emit(self, kind, **f):
        self.got.append((kind, f))


def test_layer_compiler_phases_and_graph_cap():
    """Bucketed shapes under dynamo: one 'compiling' phase per new shape, graphs ≤ buckets."""
    import torch._dynamo

    torch._dynamo.reset()
    layers = [_Layer() for _ in range(3)]
    ev = _Events()
    c = LayerCompiler(layers, max_shapes=3, events=ev, backend="eager")
    c.setup()
    from tunedeck.core.train.fastpath import graphs_compiled

    g0 = graphs_compiled()
    step = 0
    for t in (128, 128, 192, 256, 128, 192, 256):
        c.before((1, t, False), step)
        x = torch.randn(1, t, 8)
        for layer in layers:
            x = layer(x)
        step += 1
        c.after_step(step, 0.1)
    phases = [(f["phase"], f.get("shape")) for k, f in ev.got]
    assert phases == [
        ("compiling", [1, 128]),
        ("training", None),
        ("compiling", [1, 192]),
        ("training", None),
        ("compiling", [1, 256]),
        ("training", None),
    ]
    # two graphs a shape at most: the first layer's input needs no gradient, the others' do
    assert 1 <= graphs_compiled() - g0 <= 2 * 3
    c.fall_back(RuntimeError("x"), step)
    assert not c.enabled and all(layer._compiled_call_impl is None for layer in layers)
    assert ev.got[-1][1]["phase"] == "eager_fallback"


# -- real torchrun ------------------------------------------------------------------------


def _torchrun(run: Path, env: dict) -> subprocess.CompletedProcess:
    argv = trainer_torchrun_argv(run)
    return subprocess.run(
        argv,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _events(run: Path, rank: int) -> list[dict]:
    return read_events(run / "events" / f"rank{rank}.jsonl")


def test_failed_compile_falls_back_to_eager(tmp_path):
    """Compiling fails at the first forward: the run goes on eager, says so once in the log
    and as a phase event, and trains every step."""
    run = make_run_dir(tmp_path / "run", train__max_steps=3, train__compile=True)
    p = _torchrun(run, {"TUNEDECK_COMPILE_BACKEND": "eager", "TUNEDECK_TEST_COMPILE_FAIL": "1"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert (p.stdout + p.stderr).count("torch.compile failed") == 2  # once per rank
    for rank in (0, 1):
        ev = _events(run, rank)
        phases = [e["phase"] for e in ev if e["kind"] == "phase" and e["phase"] != "tokenizing"]
        assert phases == ["compiling", "eager_fallback"]
        assert "injected compiler failure" in next(
            e["error"] for e in ev if e["kind"] == "phase" and e["phase"] == "eager_fallback"
        )
        steps = [e for e in ev if e["kind"] == "step"]
        assert [e["step"] for e in steps] == [1, 2, 3]
        assert all(e["loss"] is not None and e["loss"] > 0 for e in steps)
        assert ev[-1]["kind"] == "end" and ev[-1]["reason"] == "completed"


@pytest.mark.parametrize("compile_on", [True, False])
def test_the_loss_compiles_only_with_train_compile(tmp_path, compile_on):
    """The head's chunk math is compiled alongside the layers, so train.compile = false keeps
    it eager too: a backend that raises makes a compiled run warn (once a rank) and go on
    eager, and is never asked for when compile is off."""
    run = make_run_dir(tmp_path / "run", train__max_steps=2, train__compile=compile_on)
    p = _torchrun(run, {"TUNEDECK_COMPILE_BACKEND": "eager", "TUNEDECK_TEST_COMPILE_FAIL": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count("fused output-head loss did not compile") == (2 if compile_on else 0), out
    for rank in (0, 1):
        assert [e["step"] for e in _events(run, rank) if e["kind"] == "step"] == [1, 2]


def test_compiled_run_buckets_shapes(tmp_path):
    """A compiled run (dynamo's eager backend) on variable-length chat data: every new
    padded shape is a bucket, announced by a 'compiling' phase; no compile on CPU by default.
    Its LoRA layers fused as on CUDA, with dropout inside the ops, so the two DDP ranks run
    the lean, unsplit layers."""
    run = make_run_dir(
        tmp_path / "run",
        train__max_steps=4,
        train__compile=True,
        data__max_length=512,
        method__lora_dropout=0.1,
    )
    p = _torchrun(run, {"TUNEDECK_COMPILE_BACKEND": "eager", "TUNEDECK_FUSED_LORA": "1"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    ev = _events(run, 0)
    comp = [e for e in ev if e["kind"] == "phase" and e["phase"] == "compiling"]
    assert comp and all(e["shape"][1] in length_buckets(512) for e in comp)
    done = [e for e in ev if e["kind"] == "phase" and e["phase"] == "training"]
    assert len(done) == len({tuple(e["shape"]) for e in comp})
    run2 = make_run_dir(tmp_path / "run2", train__max_steps=2, train__compile=True)
    p = _torchrun(run2, {})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    compiled = [e for e in _events(run2, 0) if e["kind"] == "phase" and e["phase"] != "tokenizing"]
    assert not compiled  # CPU: eager


def test_kcat_trains_two_ranks_as_the_default_layers_do(tmp_path):
    """TUNEDECK_LORA_EPILOGUE=kcat through the trainer: two DDP ranks, compiled layers (dynamo's
    eager backend on CPU), the widened MLPs' B blocks copied in before each forward: the same
    losses as the default layers, step by step."""
    losses = {}
    for way in ("op", "kcat"):
        run = make_run_dir(tmp_path / way, train__max_steps=4, train__compile=True)
        env = {"TUNEDECK_COMPILE_BACKEND": "eager", "TUNEDECK_FUSED_LORA": "1"}
        p = _torchrun(run, {**env, "TUNEDECK_LORA_EPILOGUE": way})
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        losses[way] = [e["loss"] for e in _events(run, 0) if e["kind"] == "step"]
    assert len(losses["op"]) == 4 and losses["op"][0] != losses["op"][-1]
    assert losses["kcat"] == pytest.approx(losses["op"], rel=1e-5)


@pytest.mark.parametrize("epilogue", ["1", "op", "after", "kcat"])
def test_compiled_layers_inside_ddp_save_what_a_lone_layer_saves(monkeypatch, epilogue):
    """Inside DDP's forward, dynamo split each compiled layer at DDP's 1 MiB first bucket once a
    layer's adapters outgrew it (a 7B layer's r=16: ~6 MB), and the split made the MLP's
    SiLU(gate)·up a saved graph input: 53 instead of 42 GiB on the H200 preset. The trainer's
    compiler keeps each layer one graph: two MLP-wide tensors saved per layer (kcat: one twice
    as wide), not three."""
    import torch._dynamo
    import torch._functorch.config as fconfig
    import torch.distributed as dist
    from lora_replay import tiny_dims
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setattr(torch._dynamo.config, "optimize_ddp", True)
    monkeypatch.setattr(fconfig, "ban_recompute_materialized_backward", True)
    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", epilogue)  # traced or opaque: same saves
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    hid, ffn = 256, 1344
    cfg = Qwen2Config(**tiny_dims(layers=2, hidden=hid, ffn=ffn, heads=8, vocab=512))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(torch.bfloat16)
    model.config.use_cache = False
    # rank 128: each layer's adapters (3.3 MB in fp32) outgrow DDP's first bucket, as a 7B's do
    model = get_peft_model(model, LoraConfig(r=128, lora_alpha=256, target_modules="all-linear"))
    assert fuse_lora(model, torch.device("cpu")) == 14
    layers = model.base_model.model.model.layers
    torch._dynamo.reset()
    LayerCompiler(layers, max_shapes=2, backend="inductor", lean=True).setup()
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        wide: dict[int, int] = {}  # storage -> bytes of the MLP-wide tensors saved

        def pack(t):
            st = t.untyped_storage()
            if (
                st.data_ptr() not in params
                and t.dim() >= 2
                and t.shape[-1] in (ffn, 2 * ffn)  # kcat: gate and up are one tensor
                and t.numel() >= 512 * ffn
            ):
                wide[st.data_ptr()] = st.nbytes()
            return t

        x = torch.randint(0, 512, (2, 256))
        for _ in range(2):  # the second step runs what was compiled
            wide.clear()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = ddp(input_ids=x, labels=x).loss
            loss.backward()
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert sum(wide.values()) == 2 * len(layers) * 512 * ffn * 2, wide  # bf16


def test_kcat_layers_save_what_the_default_layers_save(monkeypatch):
    """A compiled lean layer whose MLP and attention run kcat's wide GEMMs keeps as many bytes a
    token for backward as one running the default layers. The compiler writes x and s·x·Aᵀ into
    the wide operand in place, so backward reading a slice of it (x·Aᵀ for B's gradient, v out of
    the merged q/k/v) kept the whole operand alive: +16 GiB on the 7B preset (H100, 55.6 GiB
    reserved against 39.6). A prime token count tells what grows with the tokens from the
    per-layer constants (the concatenated A)."""
    import torch._dynamo
    import torch._functorch.config as fconfig
    from lora_replay import tiny_dims
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setattr(fconfig, "ban_recompute_materialized_backward", False)  # lean saves
    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    tokens, hid, ffn = 131, 256, 1344
    cfg = Qwen2Config(**tiny_dims(layers=1, hidden=hid, ffn=ffn, heads=8, vocab=512))

    def per_token(epilogue: str) -> float:
        monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", epilogue)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        model = get_peft_model(
            model.to(torch.bfloat16), LoraConfig(r=16, target_modules="all-linear")
        )
        assert fuse_lora(model) == 7
        params = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        stores: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params and st.nbytes() % tokens == 0:
                stores[st.data_ptr()] = st.nbytes()
            return t

        torch._dynamo.reset()
        layer = torch.compile(model.base_model.model.model.layers[0])
        h = torch.randn(1, tokens, hid, dtype=torch.bfloat16, requires_grad=True)
        pos = torch.arange(tokens)[None]
        emb = model.base_model.model.model.rotary_emb(h, pos)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = layer(h, attention_mask=None, position_ids=pos, position_embeddings=emb)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()
        return sum(stores.values()) / tokens

    try:
        saved = {ep: per_token(ep) for ep in ("op", "kcat")}  # kcat: both blocks widened
    finally:
        torch._dynamo.reset()
    assert saved["op"] >= 2 * ffn * 2, saved  # gate and up in bf16 at least
    assert saved["kcat"] == saved["op"], saved
