"""`tunedeck chat` and the TUI's chat screen: a run's checkpoint answering a prompt, streamed
token by token, beside the base model's answer to the same prompt.

One model in memory: an adapter checkpoint answers as the base with its adapter switched off
(peft `disable_adapter`), so base vs tuned costs no second copy. The adapter is not merged into
the weights for speed: in bf16, merging and taking it out again changes a quarter of the base's
weights (measured on a 7B, docs/benchmarks.md), and the base must answer as the base. Decoding is
greedy, so the two answers differ only by what training changed. `stream` blocks (it is
generate); the TUI calls it from a thread worker."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

from tunedeck.core.modelout import Source, base_model_path, load_model, load_tokenizer


@dataclass
class Answer:
    """How the last answer went: time to first token and decode rate."""

    text: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    total_s: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        decode = self.total_s - (self.ttft_s or 0.0)
        return (self.tokens - 1) / decode if self.tokens > 1 and decode > 0 else None


def pick_device(want: str = "auto") -> str:
    """`auto`: the CUDA device with the most free memory (a GPU a live run fills is passed
    over), if it has room for a small model; else the CPU."""
    if want != "auto":
        return want
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    free = [(torch.cuda.mem_get_info(i)[0], i) for i in range(torch.cuda.device_count())]
    room, idx = max(free)
    return f"cuda:{idx}" if room > 4 << 30 else "cpu"


class Chat:
    def __init__(self, src: Source, device: str = "auto", dtype: str = "auto"):
        import torch

        self.src = src
        self.device = pick_device(device)
        if dtype == "auto":
            on_gpu = self.device.startswith("cuda")
            torch_dtype = torch.bfloat16 if on_gpu else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        self.tokenizer = load_tokenizer(src)
        base, _ = base_model_path(src.spec)
        self.model = load_model(src, base, torch_dtype, self.device)
        # a full checkpoint has no adapter to switch off: the base is a second model
        self._base = None if src.adapter else load_model(None, base, torch_dtype, self.device)
        self._decoder = _Decoder()
        for _ in self.stream("hello", False, 4):  # the decoding thread's first CUDA work, now
            pass

    def close(self) -> None:
        self._decoder.close()

    def __del__(self) -> None:
        if hasattr(self, "_decoder"):
            self._decoder.close()

    def _select(self, tuned: bool):
        """(model, context) that answer: the base is the adapter model with the adapter off."""
        if self._base is not None:
            return (self.model if tuned else self._base), nullcontext()
        return self.model, (nullcontext() if tuned else self.model.disable_adapter())

    def _inputs(self, prompt: str):
        tok = self.tokenizer
        msgs = [{"role": "user", "content": prompt}]
        if tok.chat_template:
            enc = tok.apply_chat_template(
                msgs, add_generation_prompt=True, return_dict=True, return_tensors="pt"
            )
        else:
            enc = tok(prompt, return_tensors="pt")
        return {k: v.to(self.device) for k, v in enc.items()}

    def stream(
        self,
        prompt: str,
        tuned: bool = True,
        max_new_tokens: int = 96,
        answer: Answer | None = None,
    ) -> Iterator[str]:
        """The answer's text, piece by piece as it is decoded; `answer` (when given) is
        filled with its timing."""
        import torch
        from transformers import TextIteratorStreamer

        answer = answer if answer is not None else Answer()
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        counted = _TokenCount()
        failure: list[BaseException] = []
        done = threading.Event()

        def generate() -> None:
            try:
                model, off = self._select(tuned)
                with off, torch.inference_mode():
                    model.generate(
                        **self._inputs(prompt),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        streamer=_Both(streamer, counted),
                        pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                    )
            except BaseException as e:  # re-raised in the caller's thread
                failure.append(e)
                streamer.end()
            finally:
                done.set()

        t0 = time.perf_counter()
        self._decoder.submit(generate)
        for piece in streamer:
            if answer.ttft_s is None and counted.n:
                answer.ttft_s = counted.first - t0
            answer.text += piece
            answer.tokens = counted.n
            answer.total_s = time.perf_counter() - t0
            if piece:
                yield piece
        done.wait()
        if failure:
            raise failure[0]
        answer.tokens = counted.n
        answer.total_s = time.perf_counter() - t0
        if answer.ttft_s is None and counted.n:
            answer.ttft_s = counted.first - t0


class _Decoder:
    """The one thread that runs a Chat's every generate. A thread's first pass over the model's
    shapes is slow: on the H200 a 7B's first answer in a fresh thread decoded at 12 tokens/s,
    the next in the same thread at 28-49 (docs/benchmarks.md), so answers never start a thread
    of their own. The thread holds only the job queue, so a dropped Chat's model can be freed."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(
            target=self._serve, args=(self._jobs,), name="chat-generate", daemon=True
        ).start()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            job()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class _TokenCount:
    """Counts generated tokens (the streamer's first `put` is the prompt)."""

    def __init__(self) -> None:
        self.n, self.first, self._prompt = 0, 0.0, True

    def put(self, value) -> None:
        if self._prompt:
            self._prompt = False
            return
        if self.n == 0:
            self.first = time.perf_counter()
        self.n += int(value.numel())

    def end(self) -> None:
        pass


class _Both:
    def __init__(self, *streamers):
        self.streamers = streamers

    def put(self, value) -> None:
        for s in self.streamers:
            s.put(value)

    def end(self) -> None:
        for s in self.streamers:
            s.end()
