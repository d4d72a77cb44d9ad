"""Where a 7B chat answer's decode time goes, on the GPU machine: the same greedy 128-token
answer from a Qwen2.5-7B-shaped model of random bf16 weights (bench/swift_7b.py), measured warm
in each way `tunedeck chat` could decode it:

- `generate`: transformers' generate, no streamer (the library's own speed);
- `generate+stream`: the same with the streamer `Chat.stream` uses;
- `adapter`: the preset's LoRA adapter on (peft, unmerged), streamer on;
- `loop`: a hand loop of forward + argmax over the KV cache (what generate adds on top);
- `forward_gpu_ms`: one decode step's GPU time alone (CUDA events), to split launch overhead
  from kernel time;
- `static+compile`: generate with a static cache and the compiled forward (compile time apart);
- `chat`: `tunedeck chat`'s own `Chat.stream` on the preset's run: base, tuned, base, tuned,
  base, each timed, whether the base answers stay the same through the switches and how many
  base weights changed.

    python3 bench/chat_decode.py OUTDIR [--tokens 128]

Prints one JSON line (also OUTDIR/chat_decode.json)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
__import__("checkout").use()


def rate(fn, tokens: int, repeat: int = 2) -> dict:
    """Tokens/s of the best of `repeat` warm calls (the first call of all warms the kernels)."""
    import torch

    best = None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    return {"tokens": n, "s": round(best, 3), "tokens_per_s": round(n / best, 1)}


def chat_figures(res: dict, out: Path, model_dir: Path, n_new: int) -> int:
    """`Chat.stream` on the preset's run: base, tuned, base, tuned, base."""
    import model_out_7b
    import torch

    from tunedeck.core.api import Answer, Chat, pick_checkpoint

    torch.cuda.empty_cache()
    run_dir = model_out_7b.make_run(out, model_dir, "cuda:0")
    chat = Chat(pick_checkpoint(run_dir, "last"), device="cuda:0")
    prompt = "How do I find out why my data loader is slow?"
    pristine = {k: v.clone() for k, v in chat.model.get_base_model().state_dict().items()}
    answers = []
    for tuned in (False, True, False, True, False):
        ans = Answer()
        for _ in chat.stream(prompt, tuned, n_new, ans):
            pass
        answers.append(ans)
    after = chat.model.get_base_model().state_dict()
    res["chat"] = {
        "answers": [
            {
                "tuned": i % 2 == 1,
                "tokens": x.tokens,
                "ttft_s": round(x.ttft_s or 0, 4),
                "tokens_per_s": round(x.tokens_per_s or 0, 1),
            }
            for i, x in enumerate(answers)
        ],
        "base_answers_equal": answers[0].text == answers[2].text == answers[4].text,
        "base_weights_changed": sum(int((after[k] != w).sum()) for k, w in pristine.items()),
    }
    print(json.dumps(res))
    (out / "chat_decode.json").write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="only the generate/thread figures")
    ap.add_argument("--chat-only", action="store_true", help="only `Chat.stream`'s figures")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import model_out_7b
    import swift_7b
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from tunedeck.core.modelout.chat import _Both, _TokenCount

    n_new = a.tokens
    model_dir = swift_7b.make_model(out)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).to("cuda:0")
    model.eval()
    enc = tok("How do I find out why my data loader is slow?", return_tensors="pt").to("cuda:0")
    # random weights may emit EOS early: forbid stopping so every call decodes n_new tokens
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import transformers

    res["transformers"] = transformers.__version__
    if a.chat_only:
        model = None  # Chat loads its own copy
        return chat_figures(res, out, model_dir, n_new)

    def gen(m=model, streamer=None):
        with torch.inference_mode():
            o = m.generate(**enc, streamer=streamer, **kw)
        return int(o.shape[1] - enc["input_ids"].shape[1])

    gen()  # warm
    res["generate"] = rate(gen, n_new)

    def gen_stream(m=model):
        from transformers import TextIteratorStreamer

        s = TextIteratorStreamer(tok, skip_prompt=True)
        both = _Both(s, _TokenCount())
        return gen(m, both)

    res["generate+stream"] = rate(gen_stream, n_new)

    def in_thread(consume: bool):
        """generate in a second thread, as `Chat.stream` runs it; the caller reads the pieces
        (consume) or only waits."""
        from transformers import TextIteratorStreamer

        s = TextIteratorStreamer(tok, skip_prompt=True)
        got = []
        th = threading.Thread(target=lambda: got.append(gen(model, s if consume else None)))
        th.start()
        if consume:
            for _ in s:
                pass
        th.join()
        return got[0]

    res["thread"] = rate(lambda: in_thread(False), n_new)

    def warm_thread():
        """Two generates in one second thread: is the cost per call or per thread?"""
        got = []

        def work():
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                gen(model)
                torch.cuda.synchronize()
                got.append(round(n_new / (time.perf_counter() - t0), 1))

        th = threading.Thread(target=work)
        th.start()
        th.join()
        return got

    res["one_thread_two_calls_tokens_per_s"] = warm_thread()
    res["main_again"] = rate(gen, n_new)
    res["thread+stream"] = rate(lambda: in_thread(True), n_new)
    if a.quick:
        res["quick"] = True
        print(json.dumps(res))
        return 0

    def loop():
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            ids = enc["input_ids"]
            o = model(input_ids=ids, past_key_values=cache, use_cache=True)
            nxt = o.logits[:, -1:].argmax(-1)
            for _ in range(n_new - 1):
                o = model(input_ids=nxt, past_key_values=o.past_key_values, use_cache=True)
                nxt = o.logits[:, -1:].argmax(-1)
        return n_new

    loop()
    res["loop"] = rate(loop, n_new)

    with torch.inference_mode():  # one decode step's GPU time
        cache = DynamicCache(config=model.config)
        o = model(input_ids=enc["input_ids"], past_key_values=cache, use_cache=True)
        nxt = o.logits[:, -1:].argmax(-1)
        starts, ends = [], []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            o = model(input_ids=nxt, past_key_values=o.past_key_values, use_cache=True)
            e.record()
            nxt = o.logits[:, -1:].argmax(-1)
            starts.append(s)
            ends.append(e)
        torch.cuda.synchronize()
        res["forward_gpu_ms"] = round(
            sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))[10], 2
        )

    # the preset's adapter on the same model
    run_dir = model_out_7b.make_run(out, model_dir, "cuda:0")
    from peft import PeftModel

    peft = PeftModel.from_pretrained(model, str(run_dir / "output" / "checkpoint-1")).eval()
    gen_stream(peft)
    res["adapter"] = rate(lambda: gen_stream(peft), n_new)
    peft = peft.merge_and_unload()
    res["adapter_merged_in_memory"] = rate(lambda: gen_stream(peft), n_new)

    try:
        t0 = time.perf_counter()
        skw = dict(kw, cache_implementation="static")
        with torch.inference_mode():
            peft.generate(**enc, **skw)
            peft.generate(**enc, **skw)
        res["static_compile_warm_s"] = round(time.perf_counter() - t0, 1)

        def gen_static():
            with torch.inference_mode():
                o = peft.generate(**enc, **skw)
            return int(o.shape[1] - enc["input_ids"].shape[1])

        res["static+compile"] = rate(gen_static, n_new)
    except Exception as e:  # recorded, not fatal: the other figures stand
        res["static+compile"] = f"{type(e).__name__}: {e}"[:300]
    model = peft = None  # free the first copy before Chat loads its own
    return chat_figures(res, out, model_dir, n_new)


if __name__ == "__main__":
    sys.exit(main())
