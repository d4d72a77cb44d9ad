"""`tunedeck import` writes user text into TOML only through the TOML writer: a pasted command
whose quoted words hold newlines, quotes or table headers loads back as exactly the spec it
meant, and nothing else (no live `[env]`, no changed backend); secrets never reach the file."""

from __future__ import annotations

import shlex
import tomllib

import pytest

from tunedeck.core.backends.importer import import_command
from tunedeck.core.spec import loads_spec
from tunedeck.core.backends.swift.version import installed_version
from tests.conftest import cli

needs_swift = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")

INJECT = '\n[env]\nLD_PRELOAD = "/tmp/evil.so"\nbackend = "script"\n'
PAYLOADS = [
    INJECT,
    "\r" + INJECT.replace("\n", "\r\n"),
    '\r[env]\rLD_PRELOAD = "/tmp/evil.so"',
    '"\n[env]\nLD_PRELOAD = "/x"\n"',
    "'''\n[env]\nLD_PRELOAD = '/x'\n'''",
    "]]\n[[env]]\nx=1\n[env]\nLD_PRELOAD='/x'",
    "\u2028[env]\u2028LD_PRELOAD = '/x'\u2029backend = 'script'",
    "\x85[env]\x85LD_PRELOAD = '/x'",
    "\x0b[env]\x0cLD_PRELOAD = '/x'\x1c\x1d\x1e",
    "\x1b[2J\x1b]0;title\x07[env]\x00",
    "# \n[env]\n# \nLD_PRELOAD='/x'",
    "\\\n[env]\\nLD_PRELOAD='/x'",
    "\ufeff\n\t[env]\n\tLD_PRELOAD = '/x'",
]
IDS = [repr(p)[:30] for p in PAYLOADS]


def _check(text: str, imp) -> dict:
    """The file as written: only comment lines before the TOML writer's output, and the
    table it holds is exactly what the importer meant."""
    head, sep, body = text.partition("\n\n")
    assert sep, text
    for line in head.split("\n"):
        assert line.startswith("#"), f"live line in the header: {line!r}"
        # the header is plain printable text: no character a TOML reader or an editor
        # would take as a line break or a control
        assert all(c == "\t" or c.isprintable() for c in line), repr(line)
    loaded = tomllib.loads(text)
    assert loaded == imp.raw
    assert loaded == tomllib.loads(body)
    return loaded


@needs_swift
@pytest.mark.parametrize("payload", PAYLOADS, ids=IDS)
def test_swift_words_with_payloads_load_back_as_meant(payload, model_cache):
    command = shlex.join(
        [
            "swift",
            "sft",
            "--model",
            "m",
            "--dataset",
            "d" + payload,
            "--my_flag",
            payload,
            "--output_dir",
            payload,
        ]
    )
    if "\x00" in payload:
        return _nul_is_refused(command)
    imp = import_command(command)
    loaded = _check(imp.to_toml(), imp)
    assert loaded["backend"] == "swift"
    assert "env" not in loaded
    assert loaded["data"]["datasets"] == ["d" + payload]
    assert loaded["run"]["output_dir"] == payload
    assert loaded["swift"]["extra_args"][-2:] == ["--my_flag", payload]
    spec = loads_spec(imp.to_toml())
    assert spec.backend == "swift" and spec.env == {}


@pytest.mark.parametrize("payload", PAYLOADS, ids=IDS)
def test_script_words_with_payloads_load_back_as_meant(payload):
    command = shlex.join(
        ["torchrun", "--nproc_per_node", "2", "train" + payload + ".py", "--note", payload]
    )
    if "\x00" in payload:
        return _nul_is_refused(command)
    imp = import_command(command)
    loaded = _check(imp.to_toml(), imp)
    assert loaded["backend"] == "script" and "env" not in loaded
    assert loaded["script"] == {"path": "train" + payload + ".py", "args": ["--note", payload]}
    assert loaded["cluster"] == {"nproc_per_node": 2, "device": "cuda"}


@pytest.mark.parametrize("payload", PAYLOADS, ids=IDS)
def test_environment_values_and_warnings_with_payloads(payload):
    """A value before the command (env) and a note that quotes user text."""
    command = shlex.join(
        ["NCCL_DEBUG=" + payload, "torchrun", "--monitor-interval", payload, "train.py"]
    )
    if "\x00" in payload:
        return _nul_is_refused(command)
    imp = import_command(command)
    loaded = _check(imp.to_toml(), imp)
    assert loaded["env"] == {"NCCL_DEBUG": payload}
    assert loaded["backend"] == "script"


def _nul_is_refused(command: str) -> None:
    from tunedeck.core.backends.importer import CommandImportError

    with pytest.raises(CommandImportError, match="NUL"):
        import_command(command)


def test_secrets_are_not_written_to_the_spec(model_cache):
    imp = import_command(
        "HF_TOKEN=hf_SECRET1 torchrun --nproc_per_node 1 train.py "
        "--api-key=SECRET2 --password SECRET3 --lr 1"
    )
    text = imp.to_toml()
    assert "SECRET" not in text
    assert imp.raw["script"]["args"] == ["--lr", "1"]
    words = " ".join(imp.warnings)
    assert "HF_TOKEN" in words and "--api-key" in words and "--password" in words


@needs_swift
def test_swift_hub_token_is_not_kept_in_extra_args(model_cache):
    imp = import_command(
        "swift sft --model m --dataset d.jsonl --hub_token ms_SECRET --swanlab_token=sw_SECRET"
    )
    text = imp.to_toml()
    assert "SECRET" not in text
    assert "--hub_token" not in imp.raw.get("swift", {}).get("extra_args", [])
    w = " ".join(imp.warnings)
    assert "MODELSCOPE_API_TOKEN" in w and "SWANLAB_API_KEY" in w


def test_cli_import_output_file_is_safe(td_home, tmp_path):
    out = tmp_path / "imp.toml"
    cmd = shlex.join(["torchrun", "--nproc_per_node", "1", "t.py", "--x", INJECT])
    proc = cli("import", cmd, "-o", str(out), home=td_home)
    assert "Traceback" not in proc.stderr
    loaded = tomllib.loads(out.read_text())
    assert "env" not in loaded and loaded["script"]["args"] == ["--x", INJECT]
