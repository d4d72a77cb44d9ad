"""method.fp8_base on a GPU, small: does the fp8 LoRA layer give the gradients it gives on CPU?

    python3 bench/fp8_check.py [cuda|cpu]

A 2-layer Qwen2 (hidden 256) in bf16 on cuda:0 with peft LoRA (random B, so A and B both get
gradients): bf16 fused layers eager (the reference), fp8 eager, fp8 with the trainer's
per-layer compile. Prints loss, gradient norm, missing gradients and the error against the
reference; then one fp8 layer against its de-quantized math on the GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()


DEV = sys.argv[1] if len(sys.argv) > 1 else "cuda"


def model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    torch.manual_seed(0)
    with torch.device(DEV):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return get_peft_model(
        m, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    ).to(DEV)


def grads(fp8: bool, compile: bool):
    from tunedeck.core.train.fastpath import LayerCompiler
    from tunedeck.core.train.lora_fused import fuse_lora

    m = model()
    n = fuse_lora(m, torch.device(DEV), fp8=fp8)
    if compile:
        LayerCompiler(m.base_model.model.model.layers, 1).setup()
    x = torch.randint(0, 1000, (4, 128), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    with torch.autocast(DEV, dtype=torch.bfloat16):
        loss = m(input_ids=x, labels=x).loss
    req = loss.requires_grad
    loss.backward()
    g = {k: p.grad for k, p in m.named_parameters() if p.requires_grad}
    return n, float(loss), req, g


def variants():
    """The layer as committed (the adapter added in place inside the opaque scaled_mm_add
    unless TUNEDECK_LORA_EPILOGUE says otherwise), and with the adapter added in place outside
    (the form that compiled to all-zero gradients on the H200, torch 2.11, when _scaled_mm sat
    in a custom op)."""
    from tunedeck.core.train import lora_fused as lf

    class InPlace(lf._LoraLinearFP8):
        @staticmethod
        def forward(ctx, x, w8, sw, wt8, swt, bias, a, b, scale, add="0"):
            x8, sx = lf.quant_rows(x)
            y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=x.dtype)
            u = x @ a.t()
            bs = b.t() * scale
            ctx.save_for_backward(x, wt8, swt, a, bs, u)
            ctx.scale, ctx.add = scale, "0"
            return y.addmm_(u, bs)

    return {"committed": lf._LoraLinearFP8, "in-place": InPlace}


def main() -> None:
    from tunedeck.core.train import lora_fused as lf

    os.environ.setdefault("TUNEDECK_FUSED_LORA", "1")
    print(torch.__version__, torch.cuda.get_device_name() if DEV == "cuda" else DEV)
    _, ref_loss, _, ref = grads(False, False)
    print(
        f"bf16 fused eager: loss {ref_loss:.4f}, grad norm "
        f"{torch.stack([t.norm() for t in ref.values()]).norm():.4f}"
    )
    committed = lf._LoraLinearFP8
    runs = [(False, True, "bf16")] + [(True, c, name) for name in variants() for c in (False, True)]
    runs += [(True, True, "out-of-place"), (True, False, "triton"), (True, True, "triton")]
    for fp8, comp, name in runs:
        # out-of-place: the committed layer with the adapter added outside the fp8 GEMM;
        # triton: the fp8 product and the adapter in one Triton kernel (lora_triton)
        os.environ["TUNEDECK_LORA_EPILOGUE"] = {"out-of-place": "1", "triton": "triton"}.get(
            name, "op"
        )
        lf._LoraLinearFP8 = variants().get(name, committed) if fp8 else committed
        if comp:
            torch._dynamo.reset()
        try:
            n, loss, req, g = grads(fp8, comp)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name} compile={comp}: {type(e).__name__}: {str(e)[:400]}")
            continue
        finally:
            lf._LoraLinearFP8 = committed
        missing = [k for k, t in g.items() if t is None]
        err = [float((g[k] - ref[k]).norm() / ref[k].norm()) for k in ref if g[k] is not None]
        norm = (
            torch.stack([t.norm() for t in g.values() if t is not None]).norm()
            if len(missing) < len(g)
            else 0.0
        )
        print(
            f"{name} compile={comp}: {n} layers swapped, loss {loss:.4f} (requires grad "
            f"{req}), grad norm {float(norm):.4f}, {len(missing)} of {len(g)} missing, error "
            f"vs bf16 median {sorted(err)[len(err) // 2] if err else None}, max "
            f"{max(err) if err else None}"
        )

    from tunedeck.core.train.lora_fused import _LoraLinearFP8, quant_rows

    gen = torch.Generator(DEV).manual_seed(3)
    kw = dict(device=DEV, generator=gen)
    x = torch.randn(64, 256, **kw).bfloat16().requires_grad_()
    w = (torch.randn(512, 256, **kw) * 0.05).bfloat16()
    a = (torch.randn(8, 256, **kw) * 0.1).bfloat16().requires_grad_()
    b = (torch.randn(512, 8, **kw) * 0.1).bfloat16().requires_grad_()
    w8, sw = quant_rows(w.contiguous())
    wt8, swt = quant_rows(w.t().contiguous())
    y = _LoraLinearFP8.apply(x, w8, sw.t().contiguous(), wt8, swt.t().contiguous(), None, a, b, 2.0)
    dy = torch.randn(64, 512, **kw).bfloat16()
    y.backward(dy)
    deq = lambda q, s: q.float() * s  # noqa: E731
    want = (
        deq(*quant_rows(x.detach())) @ deq(w8, sw).t()
        + 2.0 * (x.detach().float() @ a.detach().float().t()) @ b.detach().float().t()
    )
    print(
        "layer forward rel err vs de-quantized math", float((y.float() - want).norm() / want.norm())
    )
    want_dx = (
        deq(*quant_rows(dy)) @ deq(wt8, swt).t()
        + (2.0 * dy.float() @ b.detach().float()) @ a.detach().float()
    )
    print(
        "layer dx rel err",
        float((x.grad.float() - want_dx).norm() / want_dx.norm()),
        "| a.grad",
        None if a.grad is None else float(a.grad.norm()),
        "| b.grad",
        None if b.grad is None else float(b.grad.norm()),
    )


if __name__ == "__main__":
    main()
