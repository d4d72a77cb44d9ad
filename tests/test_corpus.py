"""The corpus (tests/corpus/): logs as users paste them, scored the way a user judges them.

- a failure log passes when the first finding `tunedeck diagnose FILE` shows names the root
  cause (category, and the rank and host where the case names them);
- a healthy log passes when no finding is an error;
- a metrics log passes when `tunedeck metrics FILE` reads its last step and loss.

The whole corpus must score ≥ 95 % in each of the three; `python tests/test_corpus.py` prints
the score per category (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tunedeck.core.diagnose.engine import diagnose_files
from tunedeck.core.ingest.metrics import records_from_file

CORPUS = Path(__file__).resolve().parent / "corpus"
TARGET = 0.95


def failure_cases() -> list[tuple[Path, dict]]:
    out = []
    rec = json.loads((CORPUS / "recorded.json").read_text())
    for name, exp in rec.items():
        if exp["category"] is not None:
            out.append((CORPUS / "recorded" / f"{name}.log", exp))
    written = json.loads((CORPUS / "written.json").read_text())
    for fn, exp in written["failures"].items():
        out.append((CORPUS / "written" / "failures" / fn, exp))
    return out


def healthy_cases() -> list[Path]:
    rec = json.loads((CORPUS / "recorded.json").read_text())
    out = [CORPUS / "recorded" / f"{n}.log" for n, e in rec.items() if e["category"] is None]
    written = json.loads((CORPUS / "written.json").read_text())
    out += [CORPUS / "written" / "healthy" / fn for fn in written["healthy"]]
    return out


def metrics_cases() -> list[tuple[Path, dict]]:
    m = json.loads((CORPUS / "metrics.json").read_text())
    return [(CORPUS / "metrics" / fn, exp) for fn, exp in m.items()]


def judge_failure(path: Path, exp: dict) -> tuple[bool, str]:
    fs = diagnose_files([path])
    if not fs:
        return False, "no finding"
    top = fs[0]
    want = exp["category"].split("|")
    got = f"{top.category} rank={top.rank} host={top.host}"
    if top.category not in want:
        return False, got
    if exp.get("rank") is not None and top.rank != exp["rank"]:
        return False, got
    if exp.get("host") and top.host != exp["host"]:
        return False, got
    return True, got


def judge_healthy(path: Path) -> tuple[bool, str]:
    bad = [f"{f.category}: {f.summary}" for f in diagnose_files([path]) if f.severity == "error"]
    return not bad, "; ".join(bad)


def judge_metrics(path: Path, exp: dict) -> tuple[bool, str]:
    recs = [r for r in records_from_file(path) if "loss" in r]
    if not recs:
        return False, "no records"
    last = recs[-1]
    ok = last["step"] == exp["last_step"] and math.isclose(
        last["loss"], exp["last_loss"], rel_tol=1e-4
    )
    return ok, f"step {last['step']} loss {last['loss']}"


def score() -> dict:
    out = {
        "failures": defaultdict(lambda: [0, 0]),
        "healthy": [0, 0],
        "metrics": [0, 0],
        "misses": [],
    }
    for path, exp in failure_cases():
        ok, got = judge_failure(path, exp)
        cat = exp["category"].split("|")[0]
        out["failures"][cat][0] += ok
        out["failures"][cat][1] += 1
        if not ok:
            out["misses"].append(
                f"{path.name}: want {exp['category']} rank={exp.get('rank')}"
                f" host={exp.get('host')}, got {got}"
            )
    for path in healthy_cases():
        ok, got = judge_healthy(path)
        out["healthy"][0] += ok
        out["healthy"][1] += 1
        if not ok:
            out["misses"].append(f"{path.name}: healthy, got {got}")
    for path, exp in metrics_cases():
        ok, got = judge_metrics(path, exp)
        out["metrics"][0] += ok
        out["metrics"][1] += 1
        if not ok:
            out["misses"].append(
                f"{path.name}: want step {exp['last_step']} loss {exp['last_loss']}, got {got}"
            )
    return out


@pytest.fixture(scope="module")
def scored() -> dict:
    return score()


def test_corpus_is_big_enough():
    fails = failure_cases()
    assert len(fails) >= 100 and len(healthy_cases()) >= 15 and len(metrics_cases()) >= 15
    # every case that was not recorded here names the public report its shape follows
    for path, exp in fails:
        assert path.is_file(), path
        assert exp["source"].startswith(("https://github.com/", "recorded: ")), path


def test_failures_name_the_root_cause(scored):
    ok = sum(v[0] for v in scored["failures"].values())
    n = sum(v[1] for v in scored["failures"].values())
    assert ok / n >= TARGET, "\n".join(scored["misses"])


def test_healthy_logs_have_no_error(scored):
    ok, n = scored["healthy"]
    assert ok / n >= TARGET, "\n".join(scored["misses"])


def test_metrics_last_step_and_loss(scored):
    ok, n = scored["metrics"]
    assert ok / n >= TARGET, "\n".join(scored["misses"])


if __name__ == "__main__":
    s = score()
    tot = [sum(v[0] for v in s["failures"].values()), sum(v[1] for v in s["failures"].values())]
    print("| category | cases | root cause named |\n|---|---|---|")
    for cat in sorted(s["failures"]):
        ok, n = s["failures"][cat]
        print(f"| {cat} | {n} | {ok} ({ok / n:.0%}) |")
    print(f"| **all failures** | {tot[1]} | {tot[0]} ({tot[0] / tot[1]:.0%}) |")
    print(f"| healthy: no error finding | {s['healthy'][1]} | {s['healthy'][0]} |")
    print(f"| metrics: last step and loss | {s['metrics'][1]} | {s['metrics'][0]} |")
    if "-v" in sys.argv:
        print("\n".join(s["misses"]))
