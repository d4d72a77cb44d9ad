"""Every numeric key of the spec is bounded in its declaration (core/spec.py `opt(min=, max=)`,
floats finite), strings carry no NUL and fit the OS's limit for one argument, `TUNEDECK_*`
variables are reserved; every refusal is one line naming the key and the file (and line), on
every way in: TOML, --set, the form's check_option. Files that are not UTF-8 or nest 5,000 deep
are refused in one line naming the file; `--dry-run` of a spec a backend refuses prints one line,
never a traceback."""

from __future__ import annotations

import math

import pytest

from tunedeck.core.spec import (
    OPTIONS,
    SpecError,
    check_option,
    load_spec,
    loads_spec,
    set_values,
    RunSpec,
)
from tests.conftest import REPO, cli

DEMO_DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
BASE = f'name = "b"\n[data]\npath = "{DEMO_DATA}"\n'


def test_every_numeric_option_declares_both_bounds():
    numeric = [o for o in OPTIONS.values() if o.type in (int, float) and not o.choices]
    assert numeric
    unbounded = [o.key for o in numeric if o.min is None or o.max is None]
    assert unbounded == []
    assert all(o.min <= o.default <= o.max for o in numeric)


# (--set item, the one problem it must give, matched as a substring)
BAD = [
    ("cluster.master_port=70000", "cluster.master_port must be <= 65535, got 70000"),
    ("cluster.master_port=-1", "cluster.master_port must be >= 0, got -1"),
    ("cluster.nproc_per_node=100000", "cluster.nproc_per_node must be <= "),
    ("cluster.nnodes=100000000", "cluster.nnodes must be <= "),
    ("train.learning_rate=nan", "train.learning_rate must be a finite number, got nan"),
    ("train.learning_rate=inf", "train.learning_rate must be a finite number, got inf"),
    ("run.stop_grace_s=nan", "run.stop_grace_s must be a finite number, got nan"),
    ("run.restart_pause_s=-inf", "run.restart_pause_s must be a finite number"),
    ("train.weight_decay=1e400", "train.weight_decay must be a finite number"),
    ("train.seed=100000000000000000000000000", "train.seed must be <= 4294967295"),
    ("train.seed=-1", "train.seed must be >= 0, got -1"),
    ("train.max_steps=99999999999999999999", "train.max_steps must be <= "),
    ("method.lora_dropout=2.0", "method.lora_dropout must be <= 1"),
    ("data.val_split=nan", "data.val_split must be a finite number"),
    ("run.telemetry_interval_s=1e300", "run.telemetry_interval_s must be <= "),
    ('env.X="a\\u0000b"', "env.X: a NUL character cannot be passed to a process"),
    ('model.path="a\\u0000b"', "model.path: a NUL character cannot be passed to a process"),
    ('script.args=["ok", "a\\u0000b"]', "script.args: a NUL character cannot be passed"),
    (
        "env.TUNEDECK_RUN_ID=20260101-000000-other-abcd",
        "env.TUNEDECK_RUN_ID: TUNEDECK_* variables are set by tunedeck itself",
    ),
    (
        "env.TUNEDECK_ATTEMPT=3",
        "env.TUNEDECK_ATTEMPT: TUNEDECK_* variables are set by tunedeck itself",
    ),
]


@pytest.mark.parametrize("item,problem", BAD, ids=[b[0][:40] for b in BAD])
def test_set_refuses_out_of_bounds_in_one_line_naming_the_key(item, problem):
    with pytest.raises(SpecError) as e:
        loads_spec(BASE, source="s.toml", overrides=[item])
    assert len(e.value.problems) == 1, e.value.problems
    line = e.value.problems[0]
    key = item.split("=")[0]
    assert "\n" not in line and line.startswith(f"--set {key}: ") and problem in line, line


@pytest.mark.parametrize("item,problem", BAD, ids=[b[0][:40] for b in BAD])
def test_the_form_and_fixes_refuse_the_same(item, problem):
    from tunedeck.core.spec import parse_override

    key, value = parse_override(item)
    _, err = check_option(key, value)
    assert err and problem in err and "\n" not in err
    with pytest.raises(SpecError):
        set_values(RunSpec(), {key: value})


def test_bounds_hold_at_their_edges():
    ok = loads_spec(
        BASE,
        overrides=[
            "cluster.master_port=65535",
            "train.seed=4294967295",
            "train.seed=0",
            "cluster.master_port=0",
            "method.lora_dropout=1.0",
            "train.learning_rate=0",
        ],
    )
    assert ok.cluster.master_port == 0 and ok.train.seed == 0
    assert loads_spec(BASE, overrides=["cluster.master_port=1"]).cluster.master_port == 1


def test_toml_refusals_name_file_and_line(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(
        BASE + "[cluster]\nmaster_port = 70000\n[train]\nlearning_rate = nan\n"
        'seed = 100000000000000000000000000\n[env]\nOK = "1"\n'
        'TUNEDECK_RUN_ID = "x"\nBAD = "a\\u0000b"\n'
    )
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert e.value.problems == [
        f"{f}:5: cluster.master_port must be <= 65535, got 70000",
        f"{f}:7: train.learning_rate must be a finite number, got nan",
        f"{f}:8: train.seed must be <= 4294967295, got 100000000000000000000000000",
        f"{f}:11: env.TUNEDECK_RUN_ID: TUNEDECK_* variables are set by tunedeck itself "
        "(the run's id, folder and attempt); use another name",
        f"{f}:12: env.BAD: a NUL character cannot be passed to a process",
    ]


def test_env_values_over_the_os_limit_are_refused():
    big = "x" * (1 << 20)
    with pytest.raises(SpecError) as e:
        loads_spec(BASE + f'[env]\nBIG = "{big}"\n', source="s.toml")
    (line,) = e.value.problems
    assert line.startswith("s.toml:5: env.BIG: ") and "131072" in line and len(line) < 300
    # one argument of a command too (a script path, an extra arg)
    with pytest.raises(SpecError) as e:
        loads_spec(BASE, source="s.toml", overrides=[f'swift.extra_args=["{big}"]'])
    assert "swift.extra_args" in e.value.problems[0] and len(e.value.problems[0]) < 300
    # many variables under the limit each, over it together
    many = "".join(f'V{i} = "{"z" * 100_000}"\n' for i in range(12))
    with pytest.raises(SpecError) as e:
        loads_spec(BASE + "[env]\n" + many, source="s.toml")
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith("env: ")
    # just under the limit is fine: NAME=VALUE and its NUL in 131072 bytes
    val = "y" * (131072 - len("OK=") - 1)
    assert loads_spec(BASE + f'[env]\nOK = "{val}"\n').env["OK"] == val


def test_non_utf8_and_deep_files_are_one_line_refusals(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(SpecError) as e:
        load_spec(bad)
    (line,) = e.value.problems
    assert line.startswith(f"{bad}: ") and "UTF-8" in line and "\n" not in line
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpecError) as e:
        load_spec(deep)
    (line,) = e.value.problems
    assert line.startswith(f"{deep}: ") and "deep" in line
    deep_table = tmp_path / "deep2.toml"
    deep_table.write_text("a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n")
    with pytest.raises(SpecError):
        load_spec(deep_table)
    # a deep --set value is a plain string, refused by its type
    with pytest.raises(SpecError) as e:
        loads_spec(BASE, overrides=["train.seed=" + "[" * 5000 + "]" * 5000])
    assert e.value.problems[0].startswith("--set train.seed: train.seed must be int")


@pytest.mark.parametrize(
    "content", [b'name = "caf\xe9"\n', ("a = " + "[" * 5000 + "]" * 5000).encode(), b"\xff\xfe\x00"]
)
def test_cli_verbs_refuse_bad_files_without_a_traceback(content, tmp_path, td_home):
    f = tmp_path / "s.toml"
    f.write_bytes(content)
    for verb in (
        ["launch", str(f)],
        ["launch", str(f), "--dry-run"],
        ["preflight", str(f)],
        ["export", str(f)],
        ["estimate", str(f)],
    ):
        proc = cli(*verb, home=td_home, check=False)
        assert proc.returncode != 0, verb
        assert "Traceback" not in proc.stderr, (verb, proc.stderr)
        assert str(f) in proc.stderr, (verb, proc.stderr)


def test_dry_run_of_a_spec_a_backend_refuses_is_one_line(tmp_path, td_home):
    missing = tmp_path / "s.toml"
    missing.write_text(
        'name = "x"\nbackend = "script"\n[script]\npath = "nope.py"\n[cluster]\ndevice = "cpu"\n'
    )
    proc = cli("launch", str(missing), "--dry-run", home=td_home, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "script.path" in lines[0], proc.stderr
    assert str(tmp_path / "nope.py") in lines[0]


@pytest.mark.skipif(not (REPO / ".venv").exists(), reason="needs the dev environment")
def test_dry_run_of_a_swift_plan_error_is_one_line(tmp_path, td_home):
    from tunedeck.core.backends.swift.version import installed_version

    if installed_version() is None:
        pytest.skip("ms-swift not installed")
    f = tmp_path / "s.toml"
    f.write_text(
        f'name = "x"\nbackend = "swift"\n[data]\npath = "{DEMO_DATA}"\n'
        '[swift]\ncommand = "megatron-sft"\n[cluster]\ndevice = "cpu"\n'
    )
    proc = cli("launch", str(f), "--dry-run", home=td_home, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster.device" in lines[0], proc.stderr


def test_float_bounds_are_finite_numbers():
    for o in OPTIONS.values():
        if o.type is float:
            assert math.isfinite(o.min) and math.isfinite(o.max), o.key
