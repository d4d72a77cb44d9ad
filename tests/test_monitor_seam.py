"""The monitor interface lives in one layer (tunedeck.core.monitoring), below nodes, backends
and runs: the multi-node monitors take a typed MonitorContext (no `Any`), and run.db's Store
is the sink they write findings through."""

from __future__ import annotations

import typing

from tunedeck.core import monitoring
from tunedeck.core.backends import base
from tunedeck.core.monitoring import FindingsSink, MonitorContext, MonitorStore
from tunedeck.core.nodes.link import NodesMonitor
from tunedeck.core.nodes.remote import end_attempt_before
from tunedeck.core.nodes.slurm import NodesWatch
from tunedeck.core.rundir import RunDir
from tunedeck.core.supervisor import monitors
from tunedeck.core.store.store import Store


def test_nodes_monitors_take_a_typed_context():
    for fn in (NodesMonitor.__init__, NodesWatch.__init__, end_attempt_before):
        hints = typing.get_type_hints(fn)
        assert hints["ctx"] is MonitorContext, fn.__qualname__
    store_hint = typing.get_type_hints(MonitorContext)["store"]
    assert store_hint is MonitorStore


def test_one_definition_of_the_interface():
    assert base.Monitor is monitoring.Monitor
    assert monitors.MonitorContext is monitoring.MonitorContext


def test_store_is_a_findings_sink(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir(parents=True)
    with Store(run, write=True) as store:
        assert isinstance(store, FindingsSink)
        assert isinstance(store, MonitorStore)
    assert not isinstance(object(), FindingsSink)
