"""The wheel users get from `pip install .`: one import package, presets inside, usable from any
folder with no checkout on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


def _tracked_files() -> list[str]:
    """What a clone of this tree holds: tracked files and new ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    return sorted({f for f in out.stdout.decode().split("\0") if f})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files, so the checkout gets no build/ or egg-info."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for rel in _tracked_files():
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = base / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("tunedeck-*.whl")
    return whl


def test_wheel_holds_one_import_package_with_every_module_and_preset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tunedeck"}
    tracked = _tracked_files()
    # every module of core/, cli/ and tui/ (a package folder missing from pyproject's list would
    # silently drop its modules), every preset and its data, the TUI's stylesheet
    wanted = [
        f
        for f in tracked
        if f.split("/")[0] in ("core", "cli", "tui", "presets")
        and not f.endswith(".c")
        and (REPO / f).is_file()
    ]
    missing = [f for f in wanted if f"tunedeck/{f}" not in names]
    assert not missing, f"not in the wheel: {missing}"


def test_installed_wheel_runs_every_command_from_another_folder(wheel, tmp_path, model_cache):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    # the dependencies (torch, textual, ...) come from this environment's site-packages by a
    # .pth line; .pth files found there are not run, so the editable checkout stays invisible
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TUNEDECK_HOME=str(tmp_path / "home"), TUNEDECK_CACHE=str(model_cache))
    exe = str(env_dir / "bin" / "tunedeck")

    def td(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [exe, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600
        )
        if check:
            assert proc.returncode == 0, f"tunedeck {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    where = subprocess.run(
        [
            str(py),
            "-c",
            "import tunedeck.core, tunedeck.cli, tunedeck.tui; "
            "print(tunedeck.core.__file__); print(tunedeck.cli.__file__); "
            "print(tunedeck.tui.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    for line in where.stdout.split():
        assert line.startswith(site), line
    assert not any(Path(site, top).exists() for top in ("core", "cli", "tui"))

    demo = Path(site) / "tunedeck" / "presets" / "demo.toml"
    dry = td("launch", str(demo), "--dry-run").stdout
    assert "-m tunedeck.core.train" in dry
    # the demo itself, a few real steps under torchrun, all from the installed package
    td("demo", "--no-tui", "--set", "train.max_steps=6", "--set", "train.save_steps=0")
    (run,) = json.loads(td("ls", "--json").stdout)
    assert run["status"] == "succeeded" and run["step"] == 6
    rid = run["run_id"]
    # the demo went through the same preflight checklist as every launch
    state = json.loads(Path(run["run_dir"], "state.json").read_text())
    assert state["preflight"]["status"] == "passed" and state["preflight"]["by"] == "cli"
    plan = json.loads(Path(run["run_dir"], "plan.json").read_text())
    assert plan["nodes"][0]["argv"][:3] == [str(py), "-m", "torch.distributed.run"]
    assert len(json.loads(td("metrics", rid, "--json").stdout)) == 6
    assert td("status", rid).stdout.count("succeeded") == 1
    assert td("logs", rid, "-n", "5").stdout.strip()
    td("diagnose", rid)
    assert "already succeeded" in td("stop", rid).stdout
    assert "no rank process" in td("stacks", rid, check=False).stderr
    td("preflight", str(demo))
    td("estimate", str(demo))
    exported = td("export", str(demo), "--format", "sh").stdout
    assert "tunedeck.core.train" in exported
    imported = td(
        "import", "swift sft --model Qwen/Qwen2.5-7B-Instruct --dataset d.jsonl --tuner_type lora"
    ).stdout
    assert 'backend = "swift"' in imported


def test_benchmarks_use_a_checkout_that_is_not_installed(tmp_path):
    """The GPU machine runs bench/ from a bare checkout: bench/checkout.py must make the same
    `tunedeck` package importable there, presets included (-S: no site-packages, so no
    installed tunedeck to fall back on)."""
    code = (
        "import sys; sys.path.insert(0, 'bench'); import checkout; checkout.use(); "
        "import os, tunedeck.core.paths as p, tunedeck.core.rundir as r; "
        "print(p.PRESETS_DIR / 'demo.toml'); print(r.__file__); print(os.environ['PYTHONPATH'])"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]},
    )
    assert out.returncode == 0, out.stderr
    demo, rundir, pythonpath = out.stdout.split()
    assert Path(demo).resolve() == (REPO / "presets" / "demo.toml").resolve()
    assert Path(rundir).resolve() == (REPO / "core" / "rundir" / "__init__.py").resolve()
    assert pythonpath.startswith(str(tmp_path))  # children (agent, ranks) find it too
