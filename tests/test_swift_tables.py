"""ms-swift's flag table: the one shipped for the installed version pair is exactly what the
installed ms-swift's own argument classes give, and `tunedeck import` of a plain `swift sft`
answers in under 2 s on a machine that never read them (no import of ms-swift)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time

import pytest

from tunedeck.core.swift import flags
from tunedeck.core.swift.version import installed_version

pytestmark = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")


def test_shipped_table_matches_the_installed_ms_swift():
    path = flags.shipped_path()
    assert path.exists(), f"no table shipped for this version pair: {path.name}"
    shipped = json.loads(gzip.decompress(path.read_bytes()))
    built = flags.run_check(["--table"])
    assert json.loads(json.dumps(built, sort_keys=True)) == shipped


def test_import_is_fast_without_any_cache(tmp_path):
    env = dict(os.environ, TUNEDECK_CACHE=str(tmp_path / "cache"),
               TUNEDECK_HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tunedeck.tui", "import",
                           "NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct "
                           "--dataset 'AI-ModelScope/alpaca-gpt4-data-zh#500' --train_type lora"],
                          capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "--tuner_type" in proc.stderr            # checked against ms-swift's table
    assert took < 2.0, f"tunedeck import took {took:.2f} s"
    assert not (tmp_path / "cache" / "swift").exists()   # the shipped table, nothing built


def test_an_unshipped_version_is_read_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(flags, "SHIPPED", tmp_path / "none")
    monkeypatch.setattr(flags, "_TABLES", None)
    monkeypatch.setenv("TUNEDECK_CACHE", str(tmp_path / "cache"))
    first = flags.flag_tables()
    assert flags.cache_path().exists() and "sft" in first["commands"]
    monkeypatch.setattr(flags, "_TABLES", None)
    monkeypatch.setattr(flags, "run_check", lambda *a, **k: pytest.fail("built twice"))
    assert flags.flag_tables() == first
