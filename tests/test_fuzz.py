"""Fuzzed input never crashes tunedeck and never runs what it carries: spec files, `--set`
values and pasted commands, in a bounded number of examples.

Every input either loads or is refused with the project's own error (SpecError for specs,
CommandImportError / FlagTableError for pasted commands) naming what is wrong; a spec that
loads also plans and exports (the launch command is built from it); and nothing a payload
asks for ever happens (a shell substitution, a `;` chain, an injected TOML table).
"""

from __future__ import annotations

import math
import string
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunedeck.core.backends import plan_run
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import OPTIONS, SpecError, loads_spec, parse_override
from tunedeck.core.backends.swift.flags import FlagTableError

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# what a payload would leave behind if anything ever ran it
MARK = "/tmp/tunedeck-fuzz-pwned"
PAYLOADS = [
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f"; touch {MARK}",
    f"&& touch {MARK}",
    f"| touch {MARK}",
    f"\ntouch {MARK}\n",
    "'\"\\",
    "\x00",
    "\x1b[31m",
    "\u202e",
    '"\n[env]\nLD_PRELOAD = "/tmp/x.so"',
    "]]\n[[x]]",
    "\r\n",
    "\u2028",
]

texts = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.text(alphabet=string.printable, max_size=40),
)
keys = st.sampled_from(
    sorted(OPTIONS) + ["env.X", "env.HF_TOKEN", "nope.key", "train", "train.max_steps.x", ""]
)
values = st.one_of(
    texts,
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.integers(-5, 5), max_size=3),
)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v).replace("inf", "inf").replace("nan", "nan")
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.fixture(autouse=True)
def no_mark():
    Path(MARK).unlink(missing_ok=True)
    yield
    assert not Path(MARK).exists(), "a fuzzed payload was executed"


def _plans_or_refuses(spec, tmp: Path) -> None:
    """A spec that loaded is planned as a launch would plan it: it plans, or it is refused
    with a ValueError (SpecError, SwiftPlanError...) naming the key; nothing else."""
    try:
        _, plan = plan_run(spec, RunDir(tmp / "<run-id>"), local=False, gpu_count=0)
    except (ValueError, FlagTableError):
        return
    for node in plan.nodes:  # argv stays a list of words: no shell ever sees it
        assert all(isinstance(a, str) for a in node.argv)


@SETTINGS
@given(st.lists(st.tuples(keys, values), max_size=4))
def test_fuzzed_spec_files_load_or_are_refused_naming_the_key(tmp_path, pairs):
    lines = []
    for key, value in pairs:
        if "." in key:
            section, _, name = key.rpartition(".")
            lines.append(f"[{section}]\n{name} = {_toml_value(value)}")
        elif key:
            lines.append(f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n"
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        pass  # invalid TOML must be refused by loads_spec too, with the file named
    try:
        spec = loads_spec(text, source="fuzz.toml", base_dir=tmp_path)
    except SpecError as e:
        assert "fuzz.toml" in str(e) or all(p for p in e.problems)
        return
    _plans_or_refuses(spec, tmp_path)


@SETTINGS
@given(keys, texts)
def test_fuzzed_set_values_load_or_are_refused(tmp_path, key, raw):
    try:
        dotted, value = parse_override(f"{key}={raw}")
    except SpecError:
        return
    base = 'name = "f"\n[cluster]\ndevice = "cpu"\n'
    try:
        spec = loads_spec(base, source="base.toml", base_dir=tmp_path)
        from tunedeck.core.spec import set_values

        spec = set_values(spec, {dotted: value})
    except SpecError as e:
        assert e.problems
        return
    _plans_or_refuses(spec, tmp_path)


commands = st.builds(
    lambda head, words: " ".join([head, *words]),
    st.sampled_from(
        [
            "swift sft",
            "swift rlhf",
            "megatron sft",
            "torchrun --nproc_per_node 2",
            "NPROC_PER_NODE=2 swift sft",
            "CUDA_VISIBLE_DEVICES=0,1 swift pt",
        ]
    ),
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "--model",
                    "--dataset",
                    "--tuner_type",
                    "lora",
                    "--hub_token",
                    "--lr",
                    "1e-4",
                    "\\",
                    "'",
                    '"',
                ]
            ),
            texts,
        ),
        max_size=8,
    ),
)


@SETTINGS
@given(commands)
def test_fuzzed_pasted_commands_import_or_are_refused(tmp_path, command):
    try:
        imported = import_command(command)
    except (CommandImportError, FlagTableError):
        return
    text = imported.to_toml()
    spec = loads_spec(text, source="imported.toml", base_dir=tmp_path)  # loads back
    # nothing the paste carried became a live key it did not ask for
    assert "LD_PRELOAD" not in spec.env
    _plans_or_refuses(spec, tmp_path)


# -- run records: a rank's event lines and state.json ----------------------------------------
# A rank's file is data another process wrote (a user's script, a probe, a damaged disk); a
# state.json may be old, edited or half-understood. Neither may crash a reader, make a live
# run unreadable or unstoppable, or reach state.json as anything but strict JSON.

odd_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
EVENT_KEYS = (
    "step",
    "loss",
    "lr",
    "t",
    "tokens_per_s",
    "rank",
    "grad_norm",
    "step_s",
    "data_wait_s",
    "mem_gib",
    "tokens",
    "kind",
    "max_steps",
)
event_lines = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["step", "eval", "start", "end"]),
                "rank": st.one_of(st.just(0), odd_values),
            },
            optional={k: odd_values for k in EVENT_KEYS if k not in ("kind", "rank")},
        ),
        st.sampled_from(["[1, 2]", '"step"', "{", "null", '{"kind": "step", "step": 1e999}']),
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def fuzz_run(tmp_path_factory):
    """One planned run (spec.toml, plan.json, state.json) whose agent state the event
    fuzz drives in-process."""
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.spec import loads_spec

    data = Path(__file__).resolve().parent.parent / "presets" / "data" / "demo_chat.jsonl"
    spec = loads_spec(
        f'name = "fuzz"\n[data]\npath = "{data}"\n[cluster]\ndevice = "cpu"\ncpu_procs = 2\n',
        source="<fuzz>",
    )
    return prepare_run(spec, tmp_path_factory.mktemp("fuzz-home") / "runs")


@SETTINGS
@given(event_lines)
def test_fuzzed_event_lines_never_reach_state_json_or_hide_the_run(fuzz_run, monkeypatch, lines):
    import json as _json

    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.views.registry import read_run
    from tunedeck.core.store.store import Store

    monkeypatch.setenv("TUNEDECK_FAKE_NVML", "2")
    agent = Agent(fuzz_run)
    agent.state["status"] = "running"
    agent.store = Store(agent.rundir, write=True)
    try:
        agent.monitors = agent.make_monitors()
        made = [type(m).__name__ for m in agent.monitors]
        assert made
        text = "".join((x if isinstance(x, str) else _json.dumps(x)) + "\n" for x in lines)
        with open(agent.rundir.event_file(0), "a") as f:
            f.write(text)
        new = agent.ingest(live=True)
        agent.tick_monitors(time.time(), new)
        left = [type(m).__name__ for m in agent.monitors]
        assert left == made, f"an event line disabled {set(made) - set(left)}"
    finally:
        for m in agent.monitors or []:
            m.close([])
        if agent.mirror is not None:  # its tracker thread, opened with the first events
            agent.mirror.close()
        agent.store.close()

    def refuse(name):
        raise AssertionError(f"state.json holds {name}")

    state = _json.loads(agent.rundir.state.read_text(), parse_constant=refuse)
    prog = state["progress"]
    assert type(prog["step"]) is int and 0 <= prog["step"] < 2**63
    for k in ("loss", "lr", "tokens_per_s", "t"):
        assert prog.get(k) is None or (type(prog[k]) in (int, float) and math.isfinite(prog[k])), (
            k,
            prog,
        )
    info = read_run(agent.rundir.path)
    assert info is not None and not info.damaged, info and info.message


state_changes = st.dictionaries(
    st.sampled_from(
        [
            "run_id",
            "name",
            "status",
            "message",
            "created",
            "started",
            "ended",
            "agent_pid",
            "torchrun_pid",
            "worker_pids",
            "pgids",
            "pid_identity",
            "rank_pids",
            "launches",
            "progress",
            "exit_code",
            "master_port",
            "attempt",
            "stop_requested",
            "beat",
            "survivors",
            "attempts",
        ]
    ),
    st.one_of(
        odd_values,
        st.fixed_dictionaries(
            {}, optional={k: odd_values for k in ("step", "max_steps", "loss", "lr", "t")}
        ),
    ),
    max_size=4,
)


@SETTINGS
@given(state_changes)
def test_fuzzed_state_fields_damage_only_themselves(tmp_path, changes):
    import json as _json

    from tunedeck.core.views.registry import read_run
    from tunedeck.core.store.state import fatal_problem, new_state, state_problem

    run_dir = tmp_path / "runs" / "20261203-000000-fuzz-0001"
    run_dir.mkdir(parents=True, exist_ok=True)
    state = {**new_state(run_dir.name, "fuzz", 10), **changes}
    (run_dir / "state.json").write_text(_json.dumps(state))
    info = read_run(run_dir)
    assert info is not None
    if fatal_problem(_json.loads(_json.dumps(state))) is not None:
        assert info.damaged and not info.needs_stop
        return
    assert not info.damaged, (info.message, state_problem(state))
    assert type(info.step) is int and type(info.max_steps) is int
    for v in (info.loss, info.tokens_per_s, info.created, info.started, info.ended):
        assert v is None or (type(v) in (int, float) and math.isfinite(v)), info
    assert info.exit_code is None or type(info.exit_code) is int
    info.to_json()
