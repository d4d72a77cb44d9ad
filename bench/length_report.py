"""The token-length report's cost (docs/benchmarks.md): preflight's dataset scan and the report
on a 10k-row sample of a synthetic 100k-row chat file, and on the demo data, with the demo
model's tokenizer.

    PYTHONPATH=$(python3 bench/checkout.py) .venv/bin/python bench/length_report.py
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tunedeck.core.demo import ensure_tiny_model
from tunedeck.core.estimate.lengths import SAMPLE_ROWS, report, token_lengths
from tunedeck.core.preflight.inputs import scan_dataset

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "presets" / "data" / "demo_chat.jsonl"
WORDS = (
    "the a rank gradient loss model token batch step data shard memory node GPU learning "
    "rate warmup checkpoint layer attention head vector sum mean all reduce gather "
    "tensor float train eval epoch sample prompt reply answer question why how what"
).split()


def synthetic(path: Path, rows: int, seed: int = 0) -> None:
    rnd = random.Random(seed)

    def text(mean: float) -> str:
        return " ".join(rnd.choices(WORDS, k=max(1, int(rnd.lognormvariate(mean, 0.8)))))

    with path.open("w") as f:
        for _ in range(rows):
            msgs = []
            for _turn in range(rnd.randint(1, 3)):
                msgs += [
                    {"role": "user", "content": text(3.0)},
                    {"role": "assistant", "content": text(4.0)},
                ]
            f.write(json.dumps({"messages": msgs}) + "\n")


def measure(data: Path, tokenizer: Path, max_length: int, batch: int) -> None:
    t0 = time.perf_counter()
    scan = scan_dataset(data, "auto", "data.path")
    t1, c1 = time.perf_counter(), time.process_time()
    lens, exact = token_lengths(str(tokenizer), ["\n".join(t) for t in scan["samples"]])
    t2 = time.perf_counter()
    rep = report(lens, max_length, batch, exact=exact)
    t3, c3 = time.perf_counter(), time.process_time()
    print(
        f"{data.name}: {scan['rows']} rows read, {len(lens)} sampled (at most {SAMPLE_ROWS}), "
        f"{exact} tokenized"
    )
    print(
        f"  scan {t1 - t0:.2f} s, tokenize {t2 - t1:.2f} s, report {t3 - t2:.3f} s, "
        f"total {t3 - t0:.2f} s; the report (tokenize + numbers) {t3 - t1:.2f} s wall, "
        f"{c3 - c1:.2f} s CPU"
    )
    print("  " + rep.summary())
    print("  advice: " + (rep.advice() or "none"))
    print("\n".join("  " + b for b in rep.bars()))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = ensure_tiny_model(DEMO, cache=Path(tmp)) / "tokenizer.json"
        measure(DEMO, tokenizer, 512, 4)
        big = Path(tmp) / "synthetic_chat_100k.jsonl"
        synthetic(big, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
        print(f"{big.name}: {big.stat().st_size / 1e6:.1f} MB")
        measure(big, tokenizer, 512, 4)


if __name__ == "__main__":
    main()
