"""Secrets stay private: one masking rule set (core/spec.py), run directories only their owner
can read, the spec and plan as saved hold masked values and the real ones live only in the
run's 0600 secrets file (core/rundir/secrets.py); ms-swift's secret flags travel as
environment variables, never in argv; the preview says when `ps` will show a secret flag."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.rundir import RunDir, write_json_atomic
from tunedeck.core.spec import RunSpec, is_secret_name, mask_argv, mask_env
from tests.conftest import REPO

DEMO_DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
M = "****"

# -- the rules, as a table -------------------------------------------------------------------

# (name, is a credential): credential words as parts of the name (separated by _ - . digits or
# a camelCase step), not as pieces of longer words; TOKEN, KEY, PASS and AUTH only as the last
# part (they also name text tokens, attention keys, forward passes)
NAMES = [
    ("HF_TOKEN", True),
    ("HUGGING_FACE_HUB_TOKEN", True),
    ("hub_token", True),
    ("hub-token", True),
    ("hubToken", True),
    ("GITHUB_TOKEN2", True),
    ("DB_PASS", True),
    ("PASSWORD", True),
    ("MLFLOW_TRACKING_PASSWORD", True),
    ("password", True),
    ("PASSWD", True),
    ("MY_API_KEY", True),
    ("api-key", True),
    ("apiKey", True),
    ("APIKEY", True),
    ("AWS_SECRET_ACCESS_KEY", True),
    ("OPENAI_API_KEY", True),
    ("ApiKey", True),
    ("myApiKey", True),
    ("SSH_PRIVATE_KEY", True),
    ("swanlab_secret", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True),
    ("DOCKER_CREDENTIAL", True),
    ("NPM_AUTH", True),
    ("use_auth_token", True),
    ("AUTHORIZATION", True),
    ("OAuth", True),
    # not credentials: the word is a piece of another word, or a plural count of tokens
    ("KEYBOARD", False),
    ("TOKENIZERS_PARALLELISM", False),
    ("model_author", False),
    ("AUTHOR", False),
    ("max_new_tokens", False),
    ("new_special_tokens", False),
    ("lazy_tokenize", False),
    ("BYPASS", False),
    ("bypass", False),
    ("monkey", False),
    ("Keyboard", False),
    ("PWD", False),
    ("NCCL_DEBUG", False),
    ("CUDA_VISIBLE_DEVICES", False),
    ("PASSES", False),
    ("passport", False),
    ("OAUTH_CLIENT_ID", False),
    ("SECRET_KEY_BASE", True),
    ("DB_PASSWORD_FILE", True),
    ("JWT_SECRET", True),
    # KEY alone names ms-swift settings, not credentials (issue 14: a masked one in an
    # exported command changed the run, or ms-swift refused `****` as an int)
    ("KEY", False),
    ("teacher_tag_key", False),
    ("reft_layer_key", False),
    ("vera_projection_prng_key", False),
    ("IMAGE_MAX_TOKEN_NUM", False),
    ("VIDEO_MAX_TOKEN_NUM", False),
    ("SSH_AUTH_SOCK", False),
    ("AWS_ACCESS_KEY_ID", False),
    ("HF_TOKEN_PATH", False),
    ("moe_token_dispatcher_type", False),
    ("vllm_server_pass_dataset", False),
    ("calculate_per_token_loss", False),
    ("apply_query_key_layer_scaling", False),
]


@pytest.mark.parametrize("name,secret", NAMES, ids=[n for n, _ in NAMES])
def test_credential_names_are_matched_as_words(name, secret):
    assert is_secret_name(name) is secret
    assert mask_env({name: "v"}) == {name: M if secret else "v"}


# (argv, masked): --flag=value and --flag value both, NAME=value words, nothing else touched
ARGV = [
    (["--api-key=X", "--password", "Y"], ["--api-key=****", "--password", M]),
    (["--password", "Y", "--api-key=X"], ["--password", M, "--api-key=****"]),
    (["HF_TOKEN=abc", "swift", "sft"], ["HF_TOKEN=****", "swift", "sft"]),
    (
        ["DB_PASS=x", "MY_API_KEY=k", "KEYBOARD=us"],
        ["DB_PASS=****", "MY_API_KEY=****", "KEYBOARD=us"],
    ),
    (["--hub_token=tok1", "--hub_token", "tok2"], ["--hub_token=****", "--hub_token", M]),
    (["--hub-token", "t", "--model", "m"], ["--hub-token", M, "--model", "m"]),
    (
        ["--model_author", "Ann", "--max_new_tokens", "5"],
        ["--model_author", "Ann", "--max_new_tokens", "5"],
    ),
    (
        ["--moe_token_dispatcher_type", "alltoall", "--swanlab_secret", "s"],
        ["--moe_token_dispatcher_type", "alltoall", "--swanlab_secret", M],
    ),
    (["-password", "p"], ["-password", M]),
    # a secret flag followed by another flag has no value to hide
    (["--use_auth_token", "--model", "m"], ["--use_auth_token", "--model", "m"]),
    (["--hub_token"], ["--hub_token"]),
    (["--hub_token="], ["--hub_token="]),
    # hydra-style overrides
    (["trainer.max_steps=5", "+wandb.api_key=xyz"], ["trainer.max_steps=5", "+wandb.api_key=****"]),
    # a value that looks like a name is not a name
    (["--model", "HF_TOKEN=abc"], ["--model", "HF_TOKEN=****"]),
    (
        ["--tokenizer", "t", "TOKENIZERS_PARALLELISM=false"],
        ["--tokenizer", "t", "TOKENIZERS_PARALLELISM=false"],
    ),
]


@pytest.mark.parametrize("argv,masked", ARGV, ids=[" ".join(a) for a, _ in ARGV])
def test_argv_masking_table(argv, masked):
    assert mask_argv(argv) == masked


def test_one_masking_function_set():
    """No module but core/spec.py defines a secret pattern or a masking function."""
    offenders = []
    for path in (REPO / "core").rglob("*.py"):
        if path.name == "spec.py" and path.parent.name == "core":
            continue
        text = path.read_text(encoding="utf-8")
        for needle in ("def mask_", "SECRET_PATTERN = ", 're.compile(r"(TOKEN'):
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert offenders == []


# -- the run directory -----------------------------------------------------------------------


def _secret_spec(backend: str = "builtin") -> RunSpec:
    spec = RunSpec(name="sec")
    spec.data.path = str(DEMO_DATA)
    spec.cluster.device = "cpu"
    spec.train.max_steps = 2
    spec.env = {"HF_TOKEN": "hf_SECRETenv1", "DB_PASS": "SECRETdbpass2", "NCCL_DEBUG": "WARN"}
    if backend == "script":
        spec.backend = "script"
        spec.script.path = str(REPO / "tests" / "scripts" / "ddp_toy.py")
        spec.script.args = ["--api-key=SECRETflag3", "--password", "SECRETflag4", "--lr", "1"]
    return spec


SECRET_VALUES = ("hf_SECRETenv1", "SECRETdbpass2", "SECRETflag3", "SECRETflag4")


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_prepare_run_saves_masked_files_and_a_private_secrets_file(td_home):
    from tunedeck.core.rundir.secrets import read_secrets
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.spec import load_spec

    spec = _secret_spec("script")
    run = RunDir(prepare_run(spec))
    # nothing but the secrets file holds a secret value
    for p in _all_files(run.path):
        text = p.read_text(encoding="utf-8", errors="replace")
        leaked = [s for s in SECRET_VALUES if s in text]
        if p == run.secrets:
            assert sorted(leaked) == sorted(SECRET_VALUES)
        else:
            assert leaked == [], f"{p.name} holds {leaked}"
    saved = load_spec(run.spec)
    assert saved.env == {"HF_TOKEN": M, "DB_PASS": M, "NCCL_DEBUG": "WARN"}
    assert saved.script.args == ["--api-key=****", "--password", M, "--lr", "1"]
    plan = run.read_plan()
    node = plan["nodes"][0]
    assert node["env"]["HF_TOKEN"] == M and "--api-key=****" in node["argv"]
    # the agent's call: the real command from the masked plan
    secrets = read_secrets(run)
    argv, env = secrets.node_command(node)
    assert "--api-key=SECRETflag3" in argv and argv[argv.index("--password") + 1] == "SECRETflag4"
    assert env["HF_TOKEN"] == "hf_SECRETenv1" and env["DB_PASS"] == "SECRETdbpass2"
    assert env["NCCL_DEBUG"] == "WARN" and env["TUNEDECK_RUN_ID"] == run.run_id
    assert [a for a in argv if M in a] == []
    # clone/resume read the spec back with its real values
    real = secrets.unmask_spec(saved)
    assert real.env == spec.env and real.script.args == spec.script.args


def test_run_directory_is_private(td_home):
    from tunedeck.core.supervisor.launch import prepare_run

    run = RunDir(prepare_run(_secret_spec()))
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    for p in run.path.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        if p.is_dir():
            assert mode == 0o700, p
        elif p == run.launch_sh:
            assert mode == 0o700, p  # runnable by its owner only
        else:
            assert mode == 0o600, f"{p.relative_to(run.path)} is {oct(mode)}"
    assert run.secrets.exists()


def test_json_writes_stay_owner_only(tmp_path):
    old = os.umask(0)  # even a permissive umask gives 0600
    try:
        write_json_atomic(tmp_path / "x.json", {"a": 1})
        (tmp_path / "y.json").write_text("{}")
        os.chmod(tmp_path / "y.json", 0o644)
        write_json_atomic(tmp_path / "y.json", {"b": 2})  # replacing keeps it private
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "y.json").stat().st_mode) == 0o600


def test_secrets_file_tolerates_absence_and_garbage(tmp_path):
    from tunedeck.core.rundir.secrets import read_secrets

    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    node = {"node_rank": 0, "argv": ["python", "--x", "1"], "env": {"A": "1"}, "cwd": "/"}
    assert read_secrets(run).node_command(node) == (["python", "--x", "1"], {"A": "1"})
    for garbage in (
        "not json",
        "[]",
        '{"nodes": {"0": {"argv": {"9": "x"}}}}',
        '{"env": 5, "nodes": "x"}',
    ):
        run.secrets.write_text(garbage)
        assert read_secrets(run).node_command(node) == (["python", "--x", "1"], {"A": "1"})


# -- ms-swift: secret flags go through the environment ---------------------------------------


def _swift_spec(extra: list[str], env: dict | None = None) -> RunSpec:
    spec = RunSpec(name="sw", backend="swift")
    spec.data.path = str(DEMO_DATA)
    spec.cluster.device, spec.cluster.nproc_per_node = "cpu", 1
    spec.swift.extra_args = list(extra)
    spec.env = dict(env or {})
    return spec


@pytest.mark.parametrize(
    "extra,env,var",
    [
        (["--hub_token", "ms_SECRET"], {}, "MODELSCOPE_API_TOKEN"),
        (["--hub-token=ms_SECRET"], {}, "MODELSCOPE_API_TOKEN"),
        (["--use_hf", "true", "--hub_token", "ms_SECRET"], {}, "HF_TOKEN"),
        (["--hub_token", "ms_SECRET"], {"USE_HF": "1"}, "HF_TOKEN"),
        (["--swanlab_token", "ms_SECRET"], {}, "SWANLAB_API_KEY"),
    ],
)
def test_swift_secret_flags_travel_in_the_environment(
    extra, env, var, tmp_path, model_cache, monkeypatch
):
    from tunedeck.core.backends.swift import build_plan

    monkeypatch.delenv("USE_HF", raising=False)
    plan = build_plan(_swift_spec(extra, env), RunDir(tmp_path / "r"))
    node = plan.nodes[0]
    assert not any("SECRET" in a for a in node.argv), node.argv
    assert not any(
        a.lstrip("-").replace("-", "_") in ("hub_token", "swanlab_token") for a in node.argv
    )
    assert node.env[var] == "ms_SECRET"


def test_preview_says_ps_shows_secret_flags_it_cannot_hide(td_home, model_cache):
    from tunedeck.core.preflight.preview import preview, ps_warning

    p = preview(_secret_spec("script"))
    (warning,) = p.warnings
    assert "ps" in warning and "--api-key" in warning and "--password" in warning
    assert "SECRETflag" not in warning + p.script
    # secrets only in the environment: nothing for ps to show
    assert preview(_secret_spec("builtin")).warnings == []
    plan = LaunchPlan(
        "r", "script", 1, 1, [NodeCommand(0, "h", ["python", "--token", "x"], {}, "/")]
    )
    assert "--token" in ps_warning(plan)


def test_dry_run_prints_the_ps_warning(td_home, tmp_path):
    from tests.conftest import cli

    spec = tmp_path / "s.toml"
    script = REPO / "tests" / "scripts" / "ddp_toy.py"
    spec.write_text(
        f'name = "s"\nbackend = "script"\n[script]\npath = "{script}"\n'
        f'args = ["--api_key", "SECRETx"]\n[cluster]\ndevice = "cpu"\n'
    )
    out = cli("launch", str(spec), "--dry-run", home=td_home).stdout
    assert "SECRETx" not in out
    assert "--api_key" in out and "`ps`" in out


# -- a second local user reads nothing -------------------------------------------------------


def _as_nobody() -> list[str] | None:
    """A command prefix that runs as the `nobody` user, or None where that is impossible."""
    if os.geteuid() != 0:
        return None
    for tool in (
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"],
        ["setpriv", "--reuid=nobody", "--regid=nobody", "--clear-groups"],
        ["runuser", "-u", "nobody", "--"],
    ):
        if shutil.which(tool[0]) is None:
            continue
        try:
            ok = subprocess.run([*tool, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return tool
    return None


def test_another_local_user_cannot_read_any_secret(model_cache):
    from tests.conftest import cli

    prefix = _as_nobody()
    if prefix is None:
        pytest.skip(
            "needs root and setpriv/runuser to run a command as `nobody`"
            if os.geteuid() != 0
            else "cannot switch to the `nobody` user here"
        )
    # a home every user can walk to: only the run directory's own modes protect it
    base = Path(tempfile.mkdtemp(prefix="tunedeck-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        home = base / "home"
        home.mkdir(mode=0o755)
        canary = base / "canary.txt"
        canary.write_text("CANARY-readable\n")
        os.chmod(canary, 0o644)
        spec = base / "s.toml"
        spec.write_text(
            f'name = "priv"\n[data]\npath = "{DEMO_DATA}"\n[cluster]\n'
            f'device = "cpu"\nnproc_per_node = 1\n[train]\nmax_steps = 2\n'
            f'[env]\nHF_TOKEN = "hf_SECRETenv1"\nDB_PASS = "SECRETdbpass2"\n'
        )
        os.chmod(spec, 0o600)
        proc = cli(
            "launch",
            str(spec),
            "--wait",
            "--json",
            "--no-preflight",
            home=home,
            check=False,
            timeout=300,
        )
        run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
        run = RunDir(home / "runs" / run_id)
        files = _all_files(run.path)
        assert run.secrets in files and run.agent_log in files and run.db in files
        # what the agent, torchrun and the ranks wrote is private too (umask 077)
        modes = {
            str(p.relative_to(run.path)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in run.path.rglob("*")
            if p != run.launch_sh
        }
        assert {
            k: m for k, m in modes.items() if m != ("0o700" if (run.path / k).is_dir() else "0o600")
        } == {}
        assert any(k.startswith("logs/node0/") for k in modes)  # the ranks' own logs
        # as nobody: every path of the run, and the canary that proves reading works
        script = (
            'for f in "$@"; do cat -- "$f" 2>/dev/null && echo "READ:$f"; done; '
            'ls -R -- "$0" 2>/dev/null | head -n 50'
        )
        seen = subprocess.run(
            [*prefix, "sh", "-c", script, str(run.path), str(canary), *map(str, files)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            cwd="/",
        )
        assert "CANARY-readable" in seen.stdout, seen.stderr  # the harness can read
        read = [line for line in seen.stdout.splitlines() if line.startswith("READ:")]
        assert read == [f"READ:{canary}"], read
        assert not any(s in seen.stdout for s in SECRET_VALUES)
        assert run_id not in seen.stdout.replace(str(run.path), "")  # no listing either
    finally:
        from tests.conftest import _stop_leftovers

        _stop_leftovers(base / "home")
        shutil.rmtree(base, ignore_errors=True)


def test_the_ranks_get_the_real_values(td_home, tmp_path):
    """End to end: the files are masked, yet the ranks see the real secrets (the agent starts
    torchrun from read_secrets(run).node_command(node))."""
    from tests.conftest import cli

    script = tmp_path / "check_secrets.py"
    script.write_text(
        "import os, sys\n"
        "ok_env = os.environ.get('HF_TOKEN') == 'hf_SECRETenv1'\n"
        "ok_argv = '--api-key=SECRETflag3' in sys.argv and 'SECRETflag4' in sys.argv\n"
        "print('SECRETS-SEEN', ok_env, ok_argv, flush=True)\n"
    )
    spec = tmp_path / "s.toml"
    spec.write_text(
        f'name = "real"\nbackend = "script"\n[script]\npath = "{script}"\n'
        'args = ["--api-key=SECRETflag3", "--password", "SECRETflag4"]\n'
        '[cluster]\ndevice = "cpu"\nnproc_per_node = 1\n'
        '[env]\nHF_TOKEN = "hf_SECRETenv1"\n'
    )
    proc = cli(
        "launch",
        str(spec),
        "--wait",
        "--json",
        "--no-preflight",
        home=td_home,
        check=False,
        timeout=300,
    )
    run = RunDir(td_home / "runs" / json.loads(proc.stdout.splitlines()[0])["run_id"])
    logs = " ".join(p.read_text(errors="replace") for p in run.logs.rglob("stdout.log"))
    assert "SECRETS-SEEN True True" in logs, logs[-2000:]
    for p in _all_files(run.path):
        if p != run.secrets:
            text = p.read_text(encoding="utf-8", errors="replace")
            assert not any(s in text for s in SECRET_VALUES), p
