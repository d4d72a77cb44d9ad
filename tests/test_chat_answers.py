"""The chat's two answers are the models they claim to be, from one model in memory and one
decoding thread: the tuned answer is what base + adapter (peft) decodes, the base answer what the
bare base decodes, however often the user switches between them, and the base's weights are
untouched. On the demo model with an adapter of non-zero weights, on CPU."""

from __future__ import annotations

import pytest

from conftest import DEMO

torch = pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def source(tmp_path_factory, model_cache):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunedeck.core.modelout import Source, base_model_path
    from tunedeck.core.spec import load_spec

    spec = load_spec(DEMO)
    base, _ = base_model_path(spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    ckpt = tmp_path_factory.mktemp("chat-run") / "output" / "checkpoint-1"
    get_peft_model(model, lora).save_pretrained(ckpt)
    return Source(ckpt.parent.parent, spec, ckpt, 1, adapter=True), base


def greedy(model, tok, prompt: str, n: int) -> str:
    msgs = [{"role": "user", "content": prompt}]
    enc = tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.inference_mode():
        out = model.generate(
            **enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id or 0
        )
    return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def test_tuned_and_base_answers_match_their_models_across_switches(source):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunedeck.core.modelout.chat import Chat

    src, base_dir = source
    n, prompt = 24, "how do I fix a slow data loader"
    chat = Chat(src, device="cpu")
    weights = {k: v.clone() for k, v in chat.model.get_base_model().state_dict().items()}

    def answer(tuned: bool) -> str:
        return "".join(chat.stream(prompt, tuned, n))

    got = [answer(True), answer(False), answer(True), answer(False)]

    bare = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    want_base = greedy(bare, chat.tokenizer, prompt, n)
    want_tuned = greedy(
        PeftModel.from_pretrained(bare, str(src.checkpoint)).eval(), chat.tokenizer, prompt, n
    )
    assert want_tuned != want_base, "the adapter must change the answer for this test to mean"
    assert got == [want_tuned, want_base, want_tuned, want_base]
    after = chat.model.get_base_model().state_dict()
    assert all(torch.equal(after[k], w) for k, w in weights.items())
    chat.close()
