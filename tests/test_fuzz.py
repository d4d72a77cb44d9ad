"""Fuzzed input never crashes tunedeck and never runs what it carries: spec files, `--set`
values and pasted commands, in a bounded number of examples.

Every input either loads or is refused with the project's own error (SpecError for specs,
CommandImportError / FlagTableError for pasted commands) naming what is wrong; a spec that
loads also plans and exports (the launch command is built from it); and nothing a payload
asks for ever happens (a shell substitution, a `;` chain, an injected TOML table).
"""

from __future__ import annotations

import string
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunedeck.core.backends import plan_run
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import OPTIONS, SpecError, loads_spec, parse_override
from tunedeck.core.swift.flags import FlagTableError

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

# what a payload would leave behind if anything ever ran it
MARK = "/tmp/tunedeck-fuzz-pwned"
PAYLOADS = [f"$(touch {MARK})", f"`touch {MARK}`", f"; touch {MARK}", f"&& touch {MARK}",
            f"| touch {MARK}", f"\ntouch {MARK}\n", "'\"\\", "\x00", "\x1b[31m", "\u202e",
            '"\n[env]\nLD_PRELOAD = "/tmp/x.so"', "]]\n[[x]]", "\r\n", "\u2028"]

texts = st.one_of(st.sampled_from(PAYLOADS),
                  st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
                  st.text(alphabet=string.printable, max_size=40))
keys = st.sampled_from(sorted(OPTIONS) + ["env.X", "env.HF_TOKEN", "nope.key", "train",
                                          "train.max_steps.x", ""])
values = st.one_of(texts, st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                   st.booleans(), st.lists(st.integers(-5, 5), max_size=3))


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
    for node in plan.nodes:   # argv stays a list of words: no shell ever sees it
        assert all(isinstance(a, str) for a in node.argv)


@SETTINGS
@given(st.lists(st.tuples(keys, values), max_size=4))
def test_fuzzed_spec_files_load_or_are_refused_naming_the_key(tmp_path, pairs):
    lines = []
    for key, value in pairs:
        if "." in key:
            section, _, name = key.rpartition(".")
            lines.append(f'[{section}]\n{name} = {_toml_value(value)}')
        elif key:
            lines.append(f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n"
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        pass   # invalid TOML must be refused by loads_spec too, with the file named
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
    st.sampled_from(["swift sft", "swift rlhf", "megatron sft", "torchrun --nproc_per_node 2",
                     "NPROC_PER_NODE=2 swift sft", "CUDA_VISIBLE_DEVICES=0,1 swift pt"]),
    st.lists(st.one_of(st.sampled_from(["--model", "--dataset", "--tuner_type", "lora",
                                        "--hub_token", "--lr", "1e-4", "\\", "'", '"']),
                       texts), max_size=8))


@SETTINGS
@given(commands)
def test_fuzzed_pasted_commands_import_or_are_refused(tmp_path, command):
    try:
        imported = import_command(command)
    except (CommandImportError, FlagTableError):
        return
    text = imported.to_toml()
    spec = loads_spec(text, source="imported.toml", base_dir=tmp_path)   # loads back
    # nothing the paste carried became a live key it did not ask for
    assert "LD_PRELOAD" not in spec.env
    _plans_or_refuses(spec, tmp_path)
