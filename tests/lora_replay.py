"""Replaying the fused LoRA layers' dropout in peft's layers: the same elements dropped, so
the two give the same loss and gradients (tests/test_train_fastpath.py, test_train_qlora.py)."""

from __future__ import annotations

import torch


def tiny_peft(dropout: float = 0.0, arch: str = "qwen2", r: int = 4):
    """A 2-layer Qwen2 (or Llama, Mistral) with peft LoRA on every linear, B not zero."""
    import transformers
    from peft import LoraConfig, get_peft_model

    config = {"qwen2": "Qwen2Config", "llama": "LlamaConfig", "mistral": "MistralConfig"}[arch]
    cfg = getattr(transformers, config)(
        **tiny_dims(layers=2, hidden=64, ffn=128, heads=4, vocab=97)
    )
    torch.manual_seed(0)
    return get_peft_model(
        transformers.AutoModelForCausalLM.from_config(cfg),
        LoraConfig(
            r=r,
            lora_alpha=2 * r,
            lora_dropout=dropout,
            target_modules="all-linear",
            init_lora_weights=False,
        ),
    )


def tiny_dims(layers: int, hidden: int, ffn: int, heads: int, vocab: int) -> dict:
    """A decoder config's sizes, two key/value heads."""
    return dict(
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        vocab_size=vocab,
    )


def loss_and_grads(m, vocab: int = 97, autocast: bool = False):
    x = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    for p in m.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = m(input_ids=x, labels=x).loss
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in m.named_parameters() if p.requires_grad}


def train_alike(ref, fused, steps: int) -> torch.Tensor:
    """`steps` fused-AdamW steps of both models (the trainer's optimizer on CUDA, which updates
    B in place without bumping its version counter), the same loss each step, then the same
    state dict: peft's keys, values within fp32 rounding. The reference's last loss."""
    opts = [
        torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.02, fused=True)
        for m in (ref, fused)
    ]
    for _ in range(steps):
        losses = []
        for m, opt in zip((ref, fused), opts):
            opt.zero_grad(set_to_none=True)
            losses.append(loss_and_grads(m)[0])
            opt.step()
        assert torch.allclose(losses[1], losses[0], rtol=1e-5), losses
    want, got = ref.state_dict(), fused.state_dict()
    assert list(got) == list(want)
    for k in want:  # fp32 sums in another order: compare as vectors
        assert (got[k] - want[k]).norm() <= 1e-5 * want[k].norm(), k
    return losses[0]


def record_masks(monkeypatch=None) -> list[torch.Tensor]:
    """Every keep-mask the fused layers (lora_fused, qlora_fused) draw, in call order, as
    backward draws it again from the state the forward's draw returned. Without a pytest
    monkeypatch (bench/qlora_check.py) the caller puts lora_dropout.dropped back."""
    from tunedeck.core.train import lora_dropout

    masks: list[torch.Tensor] = []
    real = lora_dropout.dropped

    def record(x, p):
        xd, state = real(x, p)
        masks.append(lora_dropout.redrawn(x, p, state)[1])
        return xd, state

    (monkeypatch.setattr if monkeypatch else setattr)(lora_dropout, "dropped", record)
    return masks


def replaying(model, masks: list[torch.Tensor], p: float):
    """`model` with peft's dropout dropping the recorded masks' elements, in call order."""
    order = iter(masks)

    class Replay(torch.nn.Module):
        def forward(self, x):
            return x * next(order).view(x.shape) / (1 - p)

    for mod in model.modules():
        if hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout:
            mod.lora_dropout["default"] = Replay()
    return model
