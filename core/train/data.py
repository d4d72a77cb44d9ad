"""Chat data: `{"messages": [...]}` per line → input ids with assistant-only labels.

Labels are -100 everywhere except on assistant replies (their content and the end-of-turn
token), so the model learns to answer, not to predict prompts. Spans are found by rendering the
conversation incrementally with the tokenizer's chat template: the text that rendering message
i adds, minus the generation prompt that precedes it, is assistant i's reply. This holds for
any template that renders a prefix of the conversation as a prefix of the text (ChatML and most
others); we check that and fail loudly otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

ROLES = ("system", "user", "assistant", "tool")
IGNORE = -100


class DataError(ValueError):
    """A dataset line that cannot be used; the message starts with `file:line:`."""


def read_conversations(path: str | Path) -> list[list[dict[str, str]]]:
    """Parse and validate every line up front, so a bad line fails the run at start."""
    path = Path(path)
    out = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        for no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
            out.append(_check(obj, where))
    if not out:
        raise DataError(f"{path}: no samples")
    return out


def _check(obj: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(obj, dict) or "messages" not in obj:
        raise DataError(f"{where}: expected an object with a \"messages\" list")
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"{where}: \"messages\" must be a non-empty list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise DataError(f"{where}: messages[{i}] must be an object")
        if m.get("role") not in ROLES:
            raise DataError(f"{where}: messages[{i}].role must be one of {', '.join(ROLES)}, "
                            f"got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise DataError(f"{where}: messages[{i}].content must be a string")
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{where}: no assistant message, nothing to learn from")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def assistant_spans(tokenizer, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of the assistant replies."""
    def render(msgs, gen=False) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    text = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(messages[:i], gen=True) if i else ""
        end_text = render(messages[:i + 1])
        if not (text.startswith(end_text) and end_text.startswith(prompt)):
            raise DataError("the chat template does not render conversations incrementally; "
                            "cannot locate assistant replies")
        # Trailing whitespace after the end-of-turn token belongs to the template, not the reply.
        end = len(end_text.rstrip())
        spans.append((len(prompt), end))
    return text, spans


def encode(tokenizer, messages: list[dict[str, str]], max_length: int) -> dict[str, list[int]]:
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                    truncation=True, max_length=max_length)
    ids = enc["input_ids"]
    labels = [IGNORE] * len(ids)
    for j, (s, _e) in enumerate(enc["offset_mapping"]):
        if any(a <= s < b for a, b in spans):
            labels[j] = ids[j]
    return {"input_ids": ids, "labels": labels}


class ChatDataset(Dataset):
    """Validated conversations, tokenized lazily (cheap here, and it parallelises with
    DataLoader workers on large files)."""

    def __init__(self, path: str | Path, tokenizer, max_length: int):
        self.samples = read_conversations(path)
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return encode(self.tokenizer, self.samples[i], self.max_length)


class Collator:
    """Right-pads a batch; a class (not a closure) so DataLoader workers can pickle it."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), n), dtype=torch.long)
        for r, b in enumerate(batch):
            k = len(b["input_ids"])
            ids[r, :k] = torch.tensor(b["input_ids"])
            labels[r, :k] = torch.tensor(b["labels"])
            mask[r, :k] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def make_loader(dataset: ChatDataset, *, batch_size: int, num_workers: int, seed: int,
                rank: int, world_size: int, pin_memory: bool) -> DataLoader:
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed)
    pad_id = dataset.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = dataset.tokenizer.eos_token_id
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=Collator(pad_id), pin_memory=pin_memory,
                      persistent_workers=num_workers > 0)


class Batches:
    """Endless batches over epochs; `epoch` is the epoch the last batch came from.

    Starts at `epoch` (resume can pass the saved one); calls set_epoch so each epoch has its
    own shuffle, identical on every rank.
    """

    def __init__(self, loader: DataLoader, epoch: int = 0):
        self.loader = loader
        self.epoch = epoch
        self._it: Iterator | None = None

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        while True:
            if self._it is None:
                self.loader.sampler.set_epoch(self.epoch)
                self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
                self.epoch += 1
