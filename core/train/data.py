"""Rows → token ids with assistant-only labels, train/eval splits, batches that can resume.

Labels are -100 everywhere except on assistant replies (their content and the end-of-turn
token), so the model learns to answer, not to predict prompts. Spans are found by rendering the
conversation incrementally with the tokenizer's chat template: the text that rendering message
i adds, minus the generation prompt that precedes it, is assistant i's reply. This holds for
any template that renders a prefix of the conversation as a prefix of the text (ChatML and most
others); we check that and fail loudly otherwise.

Collators emit `targets` already shifted by one (targets[t] = the token after t, or -100), so
the loss never predicts across a padding or a document boundary in a packed row.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tunedeck.core.train.formats import DataError, Rows, read_rows  # noqa: F401 (re-exported)

IGNORE = -100


def ensure_regular(path: str | Path, what: str = "data.path") -> None:
    """A data file must be a regular file: a FIFO would block the rank on open (and the
    others in their first collective), a device never ends. Raises DataError naming the path
    and what it is, without opening it; a missing or unreadable file is left to read_rows,
    which says so with the path."""
    from tunedeck.core.demo import DataFileError, check_data_file

    try:
        check_data_file(path, what)
    except DataFileError as e:
        raise DataError(str(e)) from None
    except OSError:
        pass


def read_conversations(path: str | Path, fmt: str = "auto", **kw):
    """Validated conversations of one file (raises DataError with file:line)."""
    ensure_regular(path)
    return read_rows(path, fmt, **kw).conversations


def assistant_spans(tokenizer, messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of the assistant replies."""

    def render(msgs, gen=False) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    text = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(messages[:i], gen=True) if i else ""
        end_text = render(messages[: i + 1])
        if not (text.startswith(end_text) and end_text.startswith(prompt)):
            raise DataError(
                "the chat template does not render conversations incrementally; "
                "cannot locate assistant replies"
            )
        # Trailing whitespace after the end-of-turn token belongs to the template, not the reply.
        end = len(end_text.rstrip())
        spans.append((len(prompt), end))
    return text, spans


def encode(
    tokenizer, messages, max_length: int, truncation: str = "right"
) -> dict[str, list[int]] | None:
    """Token ids and labels; None when the sample is over max_length and truncation is drop.

    right keeps the beginning (the usual choice); left keeps the end, i.e. the last replies of
    a long conversation survive.
    """
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    labels = [IGNORE] * len(ids)
    for j, (s, _e) in enumerate(enc["offset_mapping"]):
        if any(a <= s < b for a, b in spans):
            labels[j] = ids[j]
    if len(ids) > max_length:
        if truncation == "drop":
            return None
        sl = slice(len(ids) - max_length, None) if truncation == "left" else slice(0, max_length)
        ids, labels = ids[sl], labels[sl]
    return {"input_ids": ids, "labels": labels}


class TokenizedDataset(Dataset):
    """Tokenized once, up front: lengths are needed for drop and packing, and every rank must
    see the same sample list."""

    def __init__(
        self,
        conversations,
        tokenizer,
        max_length: int,
        truncation: str = "right",
        progress: "TokenizeProgress | None" = None,
    ):
        self.samples = []
        self.dropped = 0
        total = len(conversations)
        for i, conv in enumerate(conversations):
            if progress is not None and i % 64 == 0:
                progress(i, total)
            enc = encode(tokenizer, conv, max_length, truncation)
            if enc is None:
                self.dropped += 1
            else:
                self.samples.append(enc)
        self.tokenizer = tokenizer
        if progress is not None:
            progress(total, total)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.samples[i]


class TokenizeProgress:
    """The data stage as a phase of the run: "tokenizing" phase events (done, total, rate,
    ETA) at most every `every_s`, and one warning on stderr when the whole stage would outlast
    the collective timeout: the other ranks' first collective waits that long, then the run
    fails with a timeout that says nothing about data."""

    def __init__(self, emit, timeout_s: float, rank: int = 0, every_s: float = 2.0):
        self.emit, self.timeout_s, self.rank, self.every_s = emit, timeout_s, rank, every_s
        self.t0 = time.monotonic()
        self.last = -math.inf
        self.warned = False
        self.offset = 0  # samples of earlier files (train, then eval) in this stage
        self.base = 0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < self.base:  # a new file: count on from the last one's end
            self.offset += self.base
        self.base = done
        if now - self.last < self.every_s and done < total:
            return
        self.last = now
        spent = now - self.t0
        rate = (self.offset + done) / spent if spent > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else None
        fields = {"phase": "tokenizing", "step": 0, "done": done, "total": total}
        fields["rate"] = round(rate, 1)
        if eta is not None:
            fields["eta_s"] = round(eta, 1)
        if eta is not None and not self.warned and spent + eta > self.timeout_s and done < total:
            self.warned = True
            fields["warning"] = (
                f"rank {self.rank}: tokenizing {total} samples takes about "
                f"{spent + eta:.0f} s at {rate:.0f}/s, longer than the collective timeout "
                f"({self.timeout_s:.0f} s): the other ranks would time out waiting. Raise "
                "cluster.collective_timeout_s, pre-tokenise the data, or shorten data.path."
            )
            print("warning: " + fields["warning"], file=sys.stderr, flush=True)
        self.emit("phase", **fields)


class PackedDataset(Dataset):
    """Groups of samples whose total length fits max_length, each item a list of samples.

    Grouped once, greedily in a seeded shuffled order (the same on every rank), so each epoch
    shuffles packs rather than re-packing: the data position stays meaningful for resume.
    """

    def __init__(self, base: TokenizedDataset, max_length: int, seed: int):
        order = list(range(len(base)))
        random.Random(seed).shuffle(order)
        self.packs: list[list[int]] = []
        cur, n = [], 0
        for i in order:
            k = len(base.samples[i]["input_ids"])
            if cur and n + k > max_length:
                self.packs.append(cur)
                cur, n = [], 0
            cur.append(i)
            n += k
        if cur:
            self.packs.append(cur)
        self.base = base
        self.tokenizer = base.tokenizer

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, i: int) -> list[dict[str, list[int]]]:
        return [self.base.samples[j] for j in self.packs[i]]


def _targets(labels: list[int]) -> list[int]:
    return labels[1:] + [IGNORE]


class Collator:
    """Right-pads a batch; a class (not a closure) so DataLoader workers can pickle it.

    buckets: pad to the smallest of these lengths that holds the longest sample (a compiled
    model then sees a few shapes, not one per batch); None: to the longest sample."""

    def __init__(self, pad_id: int, buckets: list[int] | None = None):
        self.pad_id = pad_id
        self.buckets = buckets

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n = max(len(b["input_ids"]) for b in batch)
        if self.buckets:
            from tunedeck.core.train.fastpath import bucket_length

            n = bucket_length(n, self.buckets)
        ids = torch.full((len(batch), n), self.pad_id, dtype=torch.long)
        targets = torch.full((len(batch), n), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), n), dtype=torch.long)
        for r, b in enumerate(batch):
            k = len(b["input_ids"])
            ids[r, :k] = torch.tensor(b["input_ids"])
            targets[r, :k] = torch.tensor(_targets(b["labels"]))
            mask[r, :k] = 1
        lens = [len(b["input_ids"]) for b in batch]
        return {
            "input_ids": ids,
            "targets": targets,
            "attention_mask": mask,
            "doc_lens": torch.tensor(lens),
        }


class FlatCollator:
    """Padding-free: every sample of the batch (packs flattened) in ONE row, position_ids
    restarting at 0 per document and no attention mask. transformers turns such position_ids
    into document-boundary-aware attention: varlen with flash_attention_2, a block-diagonal
    mask with sdpa/eager; the trainer's packed attention reads `cu_seqlens` (cumulative
    document lengths) instead.

    fixed_len: the row is filled up to this length with padding documents of at most max_doc
    tokens (no loss on them), so every batch has the same shape (one compiled graph)."""

    def __init__(self, pad_id: int = 0, fixed_len: int = 0, max_doc: int = 0):
        self.pad_id, self.fixed_len, self.max_doc = pad_id, fixed_len, max_doc

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        docs = [d for item in batch for d in (item if isinstance(item, list) else [item])]
        ids, targets, pos = [], [], []
        lens = [len(d["input_ids"]) for d in docs]
        for d in docs:
            ids += d["input_ids"]
            targets += _targets(d["labels"])
            pos += range(len(d["input_ids"]))
        seg = list(lens)
        short = self.fixed_len - len(ids)
        while short > 0:  # filler documents, each within the longest a document may be
            k = min(short, self.max_doc or short)
            ids += [self.pad_id] * k
            targets += [IGNORE] * k
            pos += range(k)
            seg.append(k)
            short -= k
        cu = [0]
        for k in seg:
            cu.append(cu[-1] + k)
        return {
            "input_ids": torch.tensor([ids]),
            "targets": torch.tensor([targets]),
            "position_ids": torch.tensor([pos]),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "doc_lens": torch.tensor(lens),
        }


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch after its first `skip` samples (per rank)."""

    skip = 0

    def __iter__(self) -> Iterator[int]:
        it = list(super().__iter__())
        skip, self.skip = self.skip, 0  # only the epoch being resumed is cut short
        return iter(it[skip:])


def pad_id_of(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return tokenizer.eos_token_id if pad is None else pad


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    num_workers: int,
    seed: int,
    rank: int,
    world_size: int,
    pin_memory: bool,
    flat: bool = False,
    shuffle: bool = True,
    fixed_shapes: int = 0,
) -> DataLoader:
    """fixed_shapes: the data's max_length, when batches should come in few shapes (a
    compiled model): padded batches in length buckets, packed rows filled to
    batch_size × max_length. 0: as long as the batch needs."""
    # drop_last keeps every rank at the same number of batches per epoch.
    sampler = ResumableSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=shuffle
    )
    pad = pad_id_of(dataset.tokenizer)
    if flat:
        collate = FlatCollator(pad, batch_size * fixed_shapes, fixed_shapes)
    else:
        from tunedeck.core.train.fastpath import length_buckets

        collate = Collator(pad, length_buckets(fixed_shapes) if fixed_shapes else None)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )


class Batches:
    """Endless batches over epochs, tracking the data position for an exact resume.

    `epoch` and `consumed` (batches taken from this epoch) describe what the trainer has
    used so far; batches a DataLoader has prefetched but we have not taken do not count.
    """

    def __init__(self, loader: DataLoader, epoch: int = 0, consumed: int = 0):
        self.loader = loader
        self.epoch = epoch
        self.consumed = consumed
        self._it: Iterator | None = None
        if len(loader) == 0:
            raise DataError("fewer samples than ranks × per_device_batch_size: nothing to train")

    def __iter__(self) -> "Batches":
        return self

    def prime(self) -> None:
        """Start the epoch's iterator now. Starting one draws from torch's global RNG (the
        DataLoader's base seed), so a resume primes BEFORE restoring the RNG state, just as
        the uninterrupted run had started it before that state was saved."""
        if self._it is None:
            self.loader.sampler.set_epoch(self.epoch)
            self.loader.sampler.skip = self.consumed * self.loader.batch_size
            self._it = iter(self.loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        while True:
            self.prime()
            try:
                b = next(self._it)
                self.consumed += 1
                return b
            except StopIteration:
                self._it = None
                self.epoch += 1
                self.consumed = 0

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_in_epoch": self.consumed}


def split_rows(convs: list, val_split: float, seed: int) -> tuple[list, list]:
    """(train, eval): val_split < 1 is a fraction of rows, >= 1 a row count. Seeded, so every
    rank and every attempt splits the same way."""
    if val_split <= 0:
        return convs, []
    n = int(val_split) if val_split >= 1 else max(1, round(len(convs) * val_split))
    if n >= len(convs):
        raise DataError(f"data.val_split {val_split:g} leaves no training rows ({len(convs)} rows)")
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return (
        [c for i, c in enumerate(convs) if i not in held],
        [c for i, c in enumerate(convs) if i in held],
    )


def load_datasets(data_spec, tokenizer, seed: int, rank: int = 0, progress=None):
    """(train, eval or None) datasets for a DataSpec; warnings go to stderr on rank 0;
    `progress`: a TokenizeProgress for the tokenizing phase."""
    names = {"model_name": data_spec.model_name, "model_author": data_spec.model_author}

    def read(path: str, what: str):
        ensure_regular(path, what)
        rows = read_rows(path, data_spec.format, names=names, skip_bad_rows=data_spec.skip_bad_rows)
        if rows.skipped and rank == 0:
            shown = "\n  ".join(rows.skipped[:5])
            more = f"\n  ... and {len(rows.skipped) - 5} more" if len(rows.skipped) > 5 else ""
            print(
                f"warning: skipped {len(rows.skipped)} bad row(s) of {path} "
                f"(data.skip_bad_rows):\n  {shown}{more}",
                file=sys.stderr,
                flush=True,
            )
        return rows.conversations

    train = read(data_spec.path, "data.path")
    if data_spec.val_path:
        evals = read(data_spec.val_path, "data.val_path")
    else:
        train, evals = split_rows(train, data_spec.val_split, seed)

    def tok(convs):
        ds = TokenizedDataset(
            convs, tokenizer, data_spec.max_length, data_spec.truncation, progress
        )
        if ds.dropped and rank == 0:
            print(
                f"warning: dropped {ds.dropped} sample(s) over data.max_length "
                f"{data_spec.max_length} (data.truncation = drop)",
                file=sys.stderr,
                flush=True,
            )
        if len(ds) == 0:
            raise DataError(
                f"{data_spec.path}: no sample fits data.max_length {data_spec.max_length}"
            )
        return ds

    return tok(train), (tok(evals) if evals else None)
