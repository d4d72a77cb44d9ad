"""Token lengths of a dataset before launch: choose data.max_length and packing from the data.

From a bounded sample of rows (preflight reads at most SAMPLE_ROWS), tokenized with the run's
tokenizer (`tokenizers` alone: no torch), the report gives a histogram, p50/p90/p99/max, the
share of samples and of tokens that data.max_length cuts, and the share of a batch that would be
padding without packing (batches of `batch_size` random samples, each padded to its longest).
The advice: the smallest multiple of 64 that holds p99 as max_length, and packing when padding
would waste a third of the batch or more. Rows are counted as the texts of their messages;
a chat template adds a few tokens per message on top.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

SAMPLE_ROWS = 10_000
BUDGET_S = 2.5  # seconds of tokenizing; the rest of the sample is estimated (token_lengths)
CHUNK = 200
BINS = 12
PACK_WASTE = 1 / 3  # padding share above which packing pays


def token_lengths(
    tokenizer_json: str, texts: list[str], budget_s: float = BUDGET_S
) -> tuple[list[int], int]:
    """Token counts of `texts` with the tokenizer file, and how many of them were tokenized:
    batches of CHUNK rows (Rust threads) until `budget_s` is spent; the rows left are
    estimated from their length in characters at the tokenized rows' tokens per character,
    so the report's cost stays bounded on a busy login node."""
    import time

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    tok.no_truncation()
    tok.no_padding()
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster
    deadline = time.monotonic() + budget_s
    out: list[int] = []
    while len(out) < len(texts) and (not out or time.monotonic() < deadline):
        chunk = texts[len(out) : len(out) + CHUNK]
        out += [len(e.ids) for e in enc(chunk, add_special_tokens=False)]
    exact = len(out)
    if exact < len(texts):
        chars = sum(len(t) for t in texts[:exact]) or 1
        ratio = sum(out) / chars
        out += [max(1, round(len(t) * ratio)) for t in texts[exact:]]
    return out, exact


def _pct(sorted_lens: list[int], p: float) -> int:
    return sorted_lens[min(len(sorted_lens) - 1, math.ceil(p * len(sorted_lens)) - 1)]


@dataclass
class LengthReport:
    n: int
    p50: int
    p90: int
    p99: int
    max: int
    max_length: int
    cut_samples: float  # share of samples longer than max_length
    cut_tokens: float  # share of all tokens beyond max_length
    pad_waste: float  # share of a padded batch that is padding (no packing)
    histogram: list[tuple[int, int]] = field(default_factory=list)  # (upper edge, count)
    advice_max_length: int = 0
    advice_packing: bool = False
    exact: int | None = None  # rows tokenized (the others estimated); None: all

    def summary(self) -> str:
        cut = (
            f"; {self.cut_samples:.1%} of samples ({self.cut_tokens:.1%} of tokens) over "
            f"data.max_length {self.max_length}"
            if self.cut_samples
            else f"; none over data.max_length {self.max_length}"
        )
        est = (
            f" ({self.exact} tokenized, the rest estimated from their length)"
            if self.exact is not None and self.exact < self.n
            else ""
        )
        return (
            f"{self.n} rows{est}: p50 {self.p50}, p90 {self.p90}, p99 {self.p99}, max {self.max} "
            f"tokens{cut}; padding without packing {self.pad_waste:.0%} of a batch"
        )

    def advice(self) -> str:
        parts = []
        if self.advice_max_length != self.max_length:
            parts.append(
                f"data.max_length={self.advice_max_length} holds 99 % of the samples"
                + (
                    ""
                    if self.advice_max_length > self.max_length
                    else f" and saves memory over {self.max_length}"
                )
            )
        if self.advice_packing:
            parts.append(
                f"data.packing=true: {self.pad_waste:.0%} of every batch is padding otherwise"
            )
        return "; ".join(parts)

    def bars(self, width: int = 30) -> list[str]:
        top = max((c for _, c in self.histogram), default=1) or 1
        return [
            f"≤{edge:>7} {'█' * round(width * c / top):<{width}} {c}" for edge, c in self.histogram
        ]


def report(
    lengths: list[int],
    max_length: int,
    batch_size: int = 1,
    seed: int = 0,
    exact: int | None = None,
) -> LengthReport:
    """The report for a sample's token lengths (at least one)."""
    if not lengths:
        raise ValueError("no sample to measure")
    s = sorted(lengths)
    total = sum(s)
    over = [n for n in s if n > max_length]
    step = max(1, math.ceil(s[-1] / BINS))
    hist: dict[int, int] = {}
    for n in s:
        edge = max(1, math.ceil(n / step)) * step
        hist[edge] = hist.get(edge, 0) + 1
    # padding: random batches of the clipped lengths, each padded to its longest
    clipped = [min(n, max_length) for n in lengths]
    random.Random(seed).shuffle(clipped)
    bs = max(1, batch_size)
    padded = sum(
        max(clipped[i : i + bs]) * len(clipped[i : i + bs]) for i in range(0, len(clipped), bs)
    )
    waste = 1 - sum(clipped) / padded if padded else 0.0
    p99 = _pct(s, 0.99)
    return LengthReport(
        n=len(s),
        p50=_pct(s, 0.5),
        p90=_pct(s, 0.9),
        p99=p99,
        max=s[-1],
        max_length=max_length,
        cut_samples=len(over) / len(s),
        cut_tokens=sum(n - max_length for n in over) / total if total else 0.0,
        pad_waste=waste,
        histogram=sorted(hist.items()),
        advice_max_length=max(64, math.ceil(p99 / 64) * 64),
        advice_packing=bs > 1 and waste >= PACK_WASTE,
        exact=exact,
    )
