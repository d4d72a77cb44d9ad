"""The fused 4-bit LoRA layer on a GPU against peft's own 4-bit layers (bitsandbytes' CUDA
kernels): loss and adapter gradients of one step, eager and with the trainer's compiled
layers, on a small Qwen2 in bf16. With dropout (0.1), 4-bit and 16-bit, the fused layers
against peft's eager layers dropping the same elements (the fused op draws its mask and draws
it again in backward from the generator state it returned; "rng_kept": backward left the CUDA
generator where the forward did). tests/test_train_qlora.py and test_train_fastpath.py check
the same on CPU.

Usage: python bench/qlora_check.py [OUTDIR]
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.lora_replay

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402

from tests.lora_replay import record_masks, replaying  # noqa: E402

from tunedeck.core.spec import RunSpec  # noqa: E402
from tunedeck.core.train.fastpath import LayerCompiler  # noqa: E402
from tunedeck.core.train.lora_fused import fuse_lora  # noqa: E402
from tunedeck.core.train.model import build_model  # noqa: E402

DEV = torch.device(os.environ.get("QLORA_CHECK_DEVICE", "cuda"))  # cpu: a dry run
LAYERS = 2


def folder() -> Path:
    path = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def build(path: Path, fused: bool, compiled: bool, method: str = "qlora", dropout: float = 0.0):
    spec = RunSpec(name="q")
    spec.method.type, spec.method.lora_rank, spec.method.lora_alpha = method, 16, 32
    spec.method.lora_dropout = dropout
    spec.model.attn_impl = "sdpa"
    torch.manual_seed(0)
    model, _ = build_model(spec, path, DEV, torch.bfloat16)
    model.train()  # as the trainer runs it (eval mode repacks 4-bit layers on some CPUs)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator(DEV).manual_seed(3))
    os.environ["TUNEDECK_FUSED_LORA"] = "1" if fused else "0"
    n = fuse_lora(model, DEV)
    if compiled:
        torch._dynamo.reset()
        layers = model.get_base_model().model.layers
        LayerCompiler(layers, max_shapes=2, backend="inductor", lean=n > 0).setup()
    return model, n


def _rng() -> torch.Tensor:
    return torch.cuda.get_rng_state() if DEV.type == "cuda" else torch.get_rng_state()


def step(model, x):
    for p in model.parameters():
        p.grad = None
    cuda = DEV.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    after_forward = _rng()
    loss.backward()
    grads = {k: p.grad.float() for k, p in model.named_parameters() if p.requires_grad}
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    return loss.item(), grads, peak, torch.equal(_rng(), after_forward)


P = 0.1


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    path = folder()
    x = torch.randint(0, 1000, (4, 512), generator=torch.Generator().manual_seed(1)).to(DEV)
    report = []

    def compare(name, ref, got):
        (ref_loss, ref_g), (loss, grads, peak, n, kept) = ref, got
        worst = max(((grads[k] - ref_g[k]).norm() / ref_g[k].norm()).item() for k in ref_g)
        line = {
            "case": name,
            "fused_layers": n,
            "loss": round(loss, 6),
            "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
            "worst_grad_rel_diff": worst,
            "peak_alloc_mib": round(peak, 1),
            "rng_kept": kept,
        }
        report.append(line)
        print(json.dumps(line), flush=True)

    def run(fused, compiled, method="qlora", dropout=0.0):
        model, n = build(path, fused, compiled, method, dropout)
        step(model, x)  # a compiled layer runs what was compiled from the second call on
        masks = record_masks() if dropout else []
        loss, grads, peak, kept = step(model, x)
        del model
        torch._dynamo.reset()
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
        return (loss, grads, peak, n, kept), masks

    from tunedeck.core.train import lora_dropout

    real_draw = lora_dropout.dropped
    rows = {
        name: run(fused, compiled)[0]
        for name, fused, compiled in (
            ("peft eager", False, False),
            ("fused eager", True, False),
            ("peft compiled", False, True),
            ("fused compiled", True, True),
        )
    }
    ref = rows["peft eager"][:2]
    for name, got in rows.items():
        compare(name, ref, got)
    for method in ("qlora", "lora"):
        for compiled in (False, True):
            got, masks = run(True, compiled, method, P)
            lora_dropout.dropped = real_draw
            peft, _ = build(path, False, False, method, P)
            ref_loss, ref_g, _, _ = step(replaying(peft, masks, P), x)
            del peft
            way = "compiled" if compiled else "eager"
            compare(f"{method} dropout {P}: fused {way} vs peft replaying", (ref_loss, ref_g), got)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "qlora_check.json").write_text(json.dumps(report, indent=1))
    ok = all(
        r["loss_rel_diff"] < 0.01 and r["worst_grad_rel_diff"] < 0.05 and r["rng_kept"]
        for r in report
    )
    print("agree" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
