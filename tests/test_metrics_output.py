"""`tunedeck metrics` prints exactly what it printed before it read run.db's columns
(tests/data/metrics_golden.json, captured from that release): on the recorded runs and log
folders, and on synthetic runs (tests/metrics_cases.py) ingested by today's agent Store."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from metrics_cases import FIXTURE_REFS, REPO, make_runs

GOLDEN = json.loads((REPO / "tests" / "data" / "metrics_golden.json").read_text())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_runs(tmp_path_factory.mktemp("metrics-cases"))


def metrics(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunedeck.tui.cli", "metrics", *args],
                          capture_output=True, cwd=REPO, timeout=120)


def check(name: str, path) -> None:
    for mode in ("json", "text"):
        p = metrics(str(path), *(["--json"] if mode == "json" else []))
        want = GOLDEN[name][mode]
        assert p.returncode == want["rc"], p.stderr.decode()
        got = hashlib.sha256(p.stdout).hexdigest()
        assert (got, len(p.stdout)) == (want["sha256"], want["bytes"]), \
            f"{name} {mode}: output differs from the pinned one\n{p.stdout[:2000].decode()}"


@pytest.mark.parametrize("ref", FIXTURE_REFS)
def test_metrics_output_unchanged_on_fixtures(ref):
    check(ref, REPO / ref)


@pytest.mark.parametrize("case", ["restart", "files_only", "old_db", "wide"])
def test_metrics_output_unchanged_on_synthetic_runs(synthetic, case):
    check(f"synthetic:{case}", synthetic[case])
