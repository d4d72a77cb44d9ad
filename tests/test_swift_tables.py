"""ms-swift's flag table: the one shipped for the installed version pair is exactly what the
installed ms-swift's own argument classes give, and `tunedeck import` of a plain `swift sft`
answers in under 2 s on a machine that never read them (no import of ms-swift)."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from tunedeck.core.backends.swift import flags
from tunedeck.core.backends.swift.version import installed_version

pytestmark = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")


@pytest.fixture(scope="module")
def built() -> dict:
    """The table as the installed ms-swift's own argument classes give it (a child process)."""
    return flags.run_check(["--table"])


def test_shipped_table_matches_the_installed_ms_swift(built):
    path = flags.shipped_path()
    assert path.exists(), f"no table shipped for this version pair: {path.name}"
    shipped = json.loads(gzip.decompress(path.read_bytes()))
    assert json.loads(json.dumps(built, sort_keys=True)) == shipped


def test_import_is_fast_without_any_cache(tmp_path):
    env = dict(
        os.environ,
        TUNEDECK_CACHE=str(tmp_path / "cache"),
        TUNEDECK_HOME=str(tmp_path / "home"),
        XDG_CACHE_HOME=str(tmp_path / "xdg"),
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunedeck.tui",
            "import",
            "NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct "
            "--dataset 'AI-ModelScope/alpaca-gpt4-data-zh#500' --train_type lora",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    took = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stderr
    assert "--tuner_type" in proc.stderr  # checked against ms-swift's table
    # CPU, not wall time: other tests share the machine (was 5.4-5.7 s of CPU; now ~0.15)
    assert cpu < 2.0, f"tunedeck import used {cpu:.2f} s of CPU"
    assert took < 10, f"tunedeck import took {took:.2f} s"
    assert not (tmp_path / "cache" / "swift").exists()  # the shipped table, nothing built


def test_an_unshipped_version_is_read_once_and_cached(tmp_path, monkeypatch, built):
    monkeypatch.setattr(flags, "SHIPPED", tmp_path / "none")
    monkeypatch.setattr(flags, "_TABLES", None)
    monkeypatch.setenv("TUNEDECK_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(flags, "run_check", lambda args, **k: calls.append(args) or built)
    first = flags.flag_tables()
    assert calls == [["--table"]]
    assert flags.cache_path().exists() and "sft" in first["commands"]
    monkeypatch.setattr(flags, "_TABLES", None)
    monkeypatch.setattr(flags, "run_check", lambda *a, **k: pytest.fail("built twice"))
    assert flags.flag_tables() == first
