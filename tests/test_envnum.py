"""The one reader of tunedeck's numeric environment variables: a typo warns by name and falls
back to the default instead of crashing the agent that reads it."""

from __future__ import annotations

import logging

import pytest

from tunedeck.core.envnum import env_number


def test_unset_or_empty_gives_the_default(monkeypatch):
    monkeypatch.delenv("TUNEDECK_X_S", raising=False)
    assert env_number("TUNEDECK_X_S", 7.5) == 7.5
    monkeypatch.setenv("TUNEDECK_X_S", "  ")
    assert env_number("TUNEDECK_X_S", 7.5) == 7.5


def test_a_number_is_read_and_held_to_its_floor(monkeypatch):
    monkeypatch.setenv("TUNEDECK_X_S", " 2.5 ")
    assert env_number("TUNEDECK_X_S", 10.0) == 2.5
    monkeypatch.setenv("TUNEDECK_X_S", "0.1")
    assert env_number("TUNEDECK_X_S", 10.0, floor=0.5) == 0.5


@pytest.mark.parametrize("raw", ["ten", "nan", "inf", "1e999", "5s"])
def test_a_typo_warns_by_name_and_uses_the_default(monkeypatch, caplog, raw):
    monkeypatch.setenv("TUNEDECK_X_S", raw)
    with caplog.at_level(logging.WARNING, logger="tunedeck.env"):
        assert env_number("TUNEDECK_X_S", 60.0) == 60.0
    assert "TUNEDECK_X_S" in caplog.text and repr(raw) in caplog.text


def test_the_agents_stall_floor_survives_a_typo(monkeypatch, tmp_path):
    """TUNEDECK_STALL_FLOOR_S used to go through a bare float(): 'abc' stopped the agent's
    detector setup with a ValueError."""
    from types import SimpleNamespace

    from tunedeck.core.detect.stall import StallDetector
    from tunedeck.core.supervisor.monitors import DetectorMonitor

    monkeypatch.setenv("TUNEDECK_STALL_FLOOR_S", "abc")
    ctx = SimpleNamespace(spec=SimpleNamespace(cluster=SimpleNamespace(nproc_per_node=2)))
    mon = DetectorMonitor(ctx)
    stall = next(d for d in mon.detectors if isinstance(d, StallDetector))
    assert stall.floor_s == 60.0
