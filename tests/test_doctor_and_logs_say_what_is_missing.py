"""`tunedeck doctor` and `tunedeck logs` say what is not there instead of calling it fine or
printing nothing: a stop.json that was never written is no "ok stop.json"; a logs folder that
is gone, or a rank the run does not have, is named on stderr with exit 1."""

from __future__ import annotations

import json
import shutil

from tests.conftest import cli
from tests.test_manage import make_run

RUN_ID = "20261203-130000-demo-c0de"


def _run(td_home, **kw):
    return make_run(td_home / "runs", RUN_ID, status="failed", **kw)


def _rank_logs(run_dir, rank: int, text: str) -> None:
    d = run_dir / "logs" / "node0" / f"{RUN_ID}_x1y2" / "attempt_0" / str(rank)
    d.mkdir(parents=True)
    (d / "stdout.log").write_text(text)
    (d / "stderr.log").write_text("")


def test_doctor_does_not_call_an_absent_stop_json_ok(td_home):
    run_dir = _run(td_home)
    assert not (run_dir / "stop.json").exists()
    out = cli("doctor", RUN_ID, home=td_home, check=False).stdout
    assert "ok  stop.json" not in out and "ok stop.json" not in out, out
    line = next(ln for ln in out.splitlines() if "stop.json" in ln)
    assert "none" in line and "no stop requested" in line, line
    # absent optional files are never "ok": secrets.json and run.db neither
    for name in ("secrets.json", "run.db"):
        lines = [ln for ln in out.splitlines() if name in ln]
        assert not any(
            ln.strip().startswith("ok") and not (run_dir / name).exists() for ln in lines
        ), out
    files = {
        f["file"]: f
        for f in json.loads(cli("doctor", RUN_ID, "--json", home=td_home, check=False).stdout)[0][
            "files"
        ]
    }
    assert files["stop.json"]["present"] is False and files["stop.json"]["problem"] is None
    assert files["spec.toml"]["present"] is True
    # once there is one, it is checked and ok
    (run_dir / "stop.json").write_text(json.dumps({"mode": "graceful", "t": 1.0}))
    out = cli("doctor", RUN_ID, home=td_home, check=False).stdout
    assert "ok  stop.json" in out, out


def test_logs_with_the_logs_folder_gone_names_it(td_home):
    run_dir = _run(td_home)
    _rank_logs(run_dir, 0, "step 1 loss 2.0\n")
    ok = cli("logs", RUN_ID, home=td_home)
    assert ok.stdout == "step 1 loss 2.0\n" and ok.stderr == ""
    shutil.rmtree(run_dir / "logs")
    for extra in ((), ("--follow",)):
        p = cli("logs", RUN_ID, *extra, home=td_home, check=False, timeout=30)
        assert p.returncode == 1 and p.stdout == "", (extra, p)
        assert str(run_dir / "logs") in p.stderr and "missing" in p.stderr, p.stderr


def test_logs_of_a_rank_the_run_does_not_have(td_home):
    run_dir = _run(td_home)
    _rank_logs(run_dir, 0, "step 1 loss 2.0\n")
    for rank in ("2", "-1"):
        p = cli("logs", RUN_ID, "--rank", rank, home=td_home, check=False, timeout=30)
        assert p.returncode == 1 and p.stdout == "", p
        assert f"no rank {rank}" in p.stderr and "0 to 1" in p.stderr, p.stderr
    # rank 1 exists but left nothing (its folder is gone): said with the folder looked in
    p = cli("logs", RUN_ID, "--rank", "1", home=td_home, check=False, timeout=30)
    assert (
        p.returncode == 1 and "rank 1" in p.stderr and str(run_dir / "logs" / "node0") in p.stderr
    ), p
    # the rank's folder is there, its files are not
    d = run_dir / "logs" / "node0" / f"{RUN_ID}_x1y2" / "attempt_0" / "0"
    for f in d.iterdir():
        f.unlink()
    p = cli("logs", RUN_ID, home=td_home, check=False, timeout=30)
    assert p.returncode == 1 and str(d) in p.stderr and "missing" in p.stderr, p
