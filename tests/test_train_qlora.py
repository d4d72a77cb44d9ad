"""QLoRA through the built-in trainer's model builder, on CPU with real bitsandbytes (its CPU
backend runs the same 4-bit layers): the quantized base saves for backward what a 16-bit LoRA
base saves, and a step trains only the adapters."""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="bitsandbytes not installed (pip install 'tunedeck[qlora]')",
)

H, INTER, LAYERS, B, T = 64, 384, 2, 2, 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = tmp_path_factory.mktemp("qwen-tiny")
    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=H,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=500,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def _build(model_dir, method, dtype=torch.bfloat16, dropout=0.0):
    from tunedeck.core.spec import RunSpec
    from tunedeck.core.train.model import build_model

    spec = RunSpec(name="q")
    spec.method.type = method
    spec.method.lora_rank = 4
    spec.method.lora_alpha = 8
    spec.method.lora_dropout = dropout
    spec.model.attn_impl = "sdpa"
    torch.manual_seed(0)
    model, _ = build_model(spec, model_dir, torch.device("cpu"), dtype)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: the adapter's product would be nothing
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(3))
    # as the trainer runs it: in eval mode, on CPUs with AVX512-BF16, bitsandbytes repacks a
    # 4-bit layer whose input needs no gradient and computes it in bf16
    return model.train()


def _saved(model) -> tuple[float, list]:
    """Bytes a token a layer the decoder saves for backward (parameters left out), and the
    dtypes of the saved MLP-wide tensors."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, torch.dtype, int]] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and t.dim() >= 2 and t.shape[0] in (B, B * T):
            seen[st.data_ptr()] = (st.nbytes(), t.dtype, t.shape[-1])
        return t

    x = torch.randint(0, 500, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model.get_base_model().model(input_ids=x)
    total = sum(n for n, _, _ in seen.values()) / (B * T) / LAYERS
    return total, [dt for _, dt, last in seen.values() if last == INTER]


def test_a_4bit_base_saves_what_a_16bit_lora_base_saves(model_dir):
    lora_bytes, _ = _saved(_build(model_dir, "lora"))
    qmodel = _build(model_dir, "qlora")
    assert any(type(m).__name__ == "Linear4bit" for m in qmodel.modules())
    qlora_bytes, mlp_dtypes = _saved(qmodel)
    # peft's kbit preparation made the norms fp32, every 4-bit linear's output fp32 and the
    # MLP's saved intermediates twice as large (+48 % here)
    assert qlora_bytes <= 1.02 * lora_bytes, (qlora_bytes, lora_bytes)
    assert mlp_dtypes and torch.float32 not in mlp_dtypes


def test_a_qlora_step_trains_only_the_adapters(model_dir):
    model = _build(model_dir, "qlora")
    x = torch.randint(0, 500, (B, T), generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    assert torch.isfinite(loss)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert all(p.grad is not None for n, p in trained.items() if "lora_B" in n)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_fused_4bit_layers_give_peft_loss_and_gradients(model_dir, monkeypatch):
    """The fused 4-bit LoRA linear (one opaque op: dequantize, frozen GEMM with the adapter's
    product as its C operand) gives peft's loss and adapter gradients; peft's own forward
    still runs a disabled adapter and a layer with dropout."""
    from tunedeck.core.train.lora_fused import fuse_lora

    cpu = torch.device("cpu")
    assert fuse_lora(_build(model_dir, "qlora"), cpu) == 0  # CPU: peft's layers unless asked
    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    x = torch.randint(0, 500, (B, T), generator=torch.Generator().manual_seed(4))

    def run(m, autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = m(input_ids=x, labels=x).loss
        loss.backward()
        return loss.detach(), {k: p.grad for k, p in m.named_parameters() if p.requires_grad}

    # fp32: the same numbers; bf16 autocast: the same up to rounding in another order
    for dtype, autocast, tol in ((torch.float32, False, 1e-5), (torch.bfloat16, True, 0.05)):
        ref_loss, ref_g = run(_build(model_dir, "qlora", dtype), autocast)
        m = _build(model_dir, "qlora", dtype)
        assert fuse_lora(m, cpu) == 7 * LAYERS
        loss, g = run(m, autocast)
        assert torch.allclose(loss, ref_loss, rtol=tol), (dtype, loss, ref_loss)
        assert set(g) == set(ref_g) and all("lora_" in k for k in g)
        for k in ref_g:  # compared as vectors: bf16 rounds in another order
            assert (g[k] - ref_g[k]).norm() <= tol * ref_g[k].norm(), (dtype, k)
        with torch.no_grad(), m.disable_adapter():
            off = m(input_ids=x).logits
        with torch.no_grad():
            on = m(input_ids=x).logits
        ref = _build(model_dir, "qlora", dtype)
        with torch.no_grad(), ref.disable_adapter():
            assert torch.equal(off, ref(input_ids=x).logits)  # peft's forward, untouched
        assert not torch.allclose(on, off)


def test_fused_4bit_dropout_is_peft_dropout_with_the_same_mask(model_dir, monkeypatch):
    """With dropout, the fused 4-bit layers give the loss and gradients peft's 4-bit layers
    give when peft drops the same elements."""
    from lora_replay import loss_and_grads, record_masks, replaying

    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    masks = record_masks(monkeypatch)
    fused = _build(model_dir, "qlora", torch.float32, dropout=0.3)
    assert fuse_lora(fused) == 7 * LAYERS
    loss, grads = loss_and_grads(fused, vocab=500)
    assert len(masks) == 7 * LAYERS
    ref = replaying(_build(model_dir, "qlora", torch.float32, dropout=0.3), masks, 0.3)
    ref_loss, ref_grads = loss_and_grads(ref, vocab=500)
    assert torch.allclose(loss, ref_loss, rtol=1e-5), (loss, ref_loss)
    for k in ref_grads:
        assert (grads[k] - ref_grads[k]).norm() <= 1e-5 * ref_grads[k].norm(), k


def test_4bit_weights_count_whole_in_flops_and_params(model_dir):
    """bitsandbytes packs two 4-bit weights in a byte: counted by their element count, the
    FLOPs of MFU and the parameter count halved (the 7B QLoRA preset read 33 % MFU for 54 %)."""
    from tunedeck.core.train.lora_fused import base_numel
    from tunedeck.core.train.model import count_params

    lora, qlora = _build(model_dir, "lora"), _build(model_dir, "qlora")
    assert base_numel(qlora) == base_numel(lora)
    assert count_params(qlora) == count_params(lora)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_fused_4bit_base_saves_what_a_fused_16bit_base_saves(model_dir, monkeypatch, compiled):
    """What backward keeps of a fused 4-bit layer is what the fused 16-bit layer keeps: its
    input and the rank-r product, never the frozen GEMM's own output beside a copy of it (12.9
    GiB of them were alive at a compiled 7B step's peak through peft's 4-bit layers)."""
    import torch._dynamo

    from tunedeck.core.train.fastpath import LayerCompiler
    from tunedeck.core.train.lora_fused import fuse_lora

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    saved = {}
    for method in ("lora", "qlora"):
        m = _build(model_dir, method)
        assert fuse_lora(m, torch.device("cpu")) == 7 * LAYERS
        if compiled:
            torch._dynamo.reset()
            layers = m.get_base_model().model.layers
            LayerCompiler(layers, max_shapes=2, backend="inductor", lean=True).setup()
        try:
            _saved(m)  # a compiled layer runs what was compiled from the second call on
            saved[method] = _saved(m)[0]
        finally:
            torch._dynamo.reset()
    assert abs(saved["qlora"] - saved["lora"]) <= 0.02 * saved["lora"], saved


_KEEP_OUT = """
import json, sys
from pathlib import Path
import torch
from tunedeck.core.spec import RunSpec
from tunedeck.core.train.model import build_model, keep_out_bitsandbytes

spec = RunSpec(name="q")
spec.method.type, spec.method.lora_rank, spec.method.lora_alpha = sys.argv[2], 4, 8
spec.model.attn_impl = "sdpa"
kept_out = keep_out_bitsandbytes(spec, Path(sys.argv[1]))
linear4bit = None
if sys.argv[3] == "build":
    model, _ = build_model(spec, Path(sys.argv[1]), torch.device("cpu"), torch.bfloat16)
    linear4bit = any(type(m).__name__ == "Linear4bit" for m in model.modules())
else:  # the weights here are not really quantized: what peft's import does is the point
    import peft  # noqa: F401
print(json.dumps({
    "kept_out": kept_out,
    "imported": sys.modules.get("bitsandbytes") is not None,
    "linear4bit": linear4bit,
}))
"""


@pytest.mark.parametrize(
    "method, quantized_config, imported",
    [("lora", False, False), ("qlora", False, True), ("lora", True, True)],
)
def test_bitsandbytes_is_imported_only_where_something_is_quantized(
    model_dir, tmp_path, method, quantized_config, imported
):
    import json
    import shutil
    import subprocess
    import sys

    path = tmp_path / "model"
    shutil.copytree(model_dir, path)
    if quantized_config:  # a checkpoint saved quantized names it in its config
        cfg = json.loads((path / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
        (path / "config.json").write_text(json.dumps(cfg))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _KEEP_OUT,
            str(path),
            method,
            "import" if quantized_config else "build",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # peft imports bitsandbytes for every LoRA model when it is installed; a plain LoRA
    # rank trains without it, a quantized one still gets it
    built = None if quantized_config else imported
    assert got == {"kept_out": not imported, "imported": imported, "linear4bit": built}
