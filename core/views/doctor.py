"""`tunedeck doctor`: what is wrong with a run directory, file by file.

Readers tolerate damage (a damaged state.json lists the run as `damaged: state.json: <why>`,
other files make only the verbs that need them refuse in one line); this says everything that
is wrong at once, so a user can repair or delete the run knowing what is lost. It only reads.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.rundir import RunDir, json_problem
from tunedeck.core.store.state import TERMINAL, state_problem


@dataclass
class FileCheck:
    file: str  # relative to the run directory
    problem: str | None  # None: fine (or absent, when `present` is False)
    note: str = ""  # what still works, or what it means
    # False: an optional file that is not there (no stop requested, no run.db yet): nothing
    # is wrong, and nothing was checked either, so it is never called "ok"
    present: bool = True

    def to_json(self) -> dict[str, str | bool | None]:
        return {
            "file": self.file,
            "problem": self.problem,
            "note": self.note,
            "present": self.present,
        }


# Bytes of an event file a check reads at most: a long run's files are large and the last
# lines are the ones a damaged write leaves behind.
EVENT_TAIL_BYTES = 4 << 20
# What the agent's store creates first (core/store/store.py): a file without them is another one.
REQUIRED_TABLES = {"events", "offsets", "findings"}


def check_run(run_dir: Path) -> list[FileCheck]:
    run = RunDir(run_dir)
    state, why = json_problem(run.state)
    why = why or state_problem(state)
    ended = isinstance(state, dict) and not why and state.get("status") in TERMINAL
    checks = [
        FileCheck(
            "state.json",
            why,
            ""
            if not why
            else "the run is listed as damaged; its processes cannot be told, so "
            "`stop` will not signal anything",
        )
    ]
    checks.append(_spec(run))
    checks.append(_plan(run))
    checks.append(_secrets(run))
    checks.append(_stop(run))
    checks.append(_db(run, ended))
    checks.extend(_events(run, ended))
    if not run.launch_sh.exists():
        checks.append(FileCheck("launch.sh", "missing"))
    return checks


def problems(checks: list[FileCheck]) -> list[FileCheck]:
    return [c for c in checks if c.problem]


def cut_short(run: RunDir, backend: str) -> str | None:
    """Why a spec.toml that loads was still cut short, or None. A cut file can be valid TOML
    ("lora_rank = 1" of 16, whole tables gone) whose lost keys would come back as defaults;
    tunedeck writes whole lines and, for the trainers' specs, every table, [env] last."""
    try:
        raw = run.spec.read_bytes()
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if raw and not raw.endswith(b"\n"):
        return "cut short: its last line has no newline"
    if not traits_of(backend).sparse_toml and raw and b"\n[env]" not in raw:
        return "cut short: no [env] table (written last)"
    return None


def _spec(run: RunDir) -> FileCheck:
    from tunedeck.core.spec import SpecError, load_spec

    if not run.spec.exists():
        return FileCheck("spec.toml", "missing", "clone and resume need it")
    try:
        spec = load_spec(run.spec)
    except SpecError as e:
        return FileCheck("spec.toml", str(e).splitlines()[0], "clone and resume need it")
    if why := cut_short(run, spec.backend):
        return FileCheck(
            "spec.toml", why, "clone and resume need it; its settings may have lost values"
        )
    return FileCheck("spec.toml", None)


def _plan(run: RunDir) -> FileCheck:
    plan, why = json_problem(run.plan)
    if why is None:
        why = plan_problem(plan)
    return FileCheck(
        "plan.json", why, "" if not why else "a new agent cannot adopt this run if its agent dies"
    )


def plan_problem(plan: dict) -> str | None:
    """Why plan.json's content is not a launch plan, or None."""
    for key in ("nproc_per_node", "nnodes"):
        v = plan.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"{key}: expected a positive integer, got {v!r}"[:120]
    nodes = plan.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        return "nodes: expected a list of node commands"
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            return f"nodes[{i}]: expected an object"
        argv, env = n.get("argv"), n.get("env")
        if not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
            return f"nodes[{i}].argv: expected a list of strings"
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            return f"nodes[{i}].env: expected an object of strings"
    return None


def _secrets(run: RunDir) -> FileCheck:
    data, why = json_problem(run.secrets)
    if why == "missing":
        return FileCheck(
            "secrets.json", None, "missing: clone and resume use masked values", present=False
        )
    if why is None:
        for key, want in (("env", dict), ("lists", dict), ("nodes", dict)):
            if key in data and not isinstance(data[key], want):
                why = f"{key}: expected an object, got {type(data[key]).__name__}"
                break
    return FileCheck(
        "secrets.json",
        why,
        "" if not why else "the run's secrets are lost: clone and resume get masked values",
    )


def _stop(run: RunDir) -> FileCheck:
    req, why = json_problem(run.stop_request)
    if why == "missing":
        return FileCheck("stop.json", None, "no stop requested", present=False)
    if why is None and req.get("mode") not in ("graceful", "hard"):
        why = f"mode: expected graceful or hard, got {req.get('mode')!r}"[:120]
    return FileCheck("stop.json", why, "" if not why else "the stop request is ignored")


def _db(run: RunDir, ended: bool) -> FileCheck:
    if not run.db.exists():
        return FileCheck(
            "run.db",
            None,
            "not written yet"
            if not ended
            else "missing: metrics and telemetry come from the event files",
            present=False,
        )
    try:
        con = sqlite3.connect(f"file:{run.db}?mode=ro", uri=True, timeout=5)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
            tables = {
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not REQUIRED_TABLES - tables:
                con.execute("SELECT rank, kind FROM events LIMIT 1").fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        return FileCheck(
            "run.db",
            f"not a readable database ({e})",
            "metrics, findings and telemetry of this run cannot be read",
        )
    bad = [r[0] for r in rows if r and r[0] != "ok"]
    if bad:
        return FileCheck("run.db", f"damaged ({bad[0]})")
    missing = sorted(REQUIRED_TABLES - tables)
    if missing:
        return FileCheck(
            "run.db",
            f"not a run's database (no {', '.join(missing)} table)",
            "metrics, findings and telemetry of this run cannot be read",
        )
    return FileCheck("run.db", None)


def _ingested(run: RunDir) -> dict[str, int]:
    """How many bytes of each event file the agent has read into run.db ({} when run.db
    cannot tell)."""
    try:
        con = sqlite3.connect(f"file:{run.db}?mode=ro", uri=True, timeout=5)
        try:
            rows = con.execute("SELECT file, offset FROM offsets").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    return {f: o for f, o in rows if isinstance(f, str) and isinstance(o, int)}


def _events(run: RunDir, ended: bool) -> list[FileCheck]:
    out = []
    read = _ingested(run) if run.db.exists() else {}
    for path in run.event_files() + run.probe_files():
        name = f"events/{path.name}"
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                f.seek(max(0, size - EVENT_TAIL_BYTES))
                data = f.read()
        except OSError as e:
            out.append(FileCheck(name, f"unreadable ({e.strerror or e})"))
            continue
        lines = data.split(b"\n")
        if size > EVENT_TAIL_BYTES:
            lines = lines[1:]  # the first may be cut by where the read began
        # a live writer may be mid-line: its last unterminated line is not damage
        last_open = not data.endswith(b"\n") and not ended
        bad = first = 0
        for i, line in enumerate(lines):
            if not line.strip() or (last_open and i == len(lines) - 1):
                continue
            try:
                ok = event_ok(json.loads(line))
            except ValueError:
                ok = False
            if not ok:
                bad += 1
                first = first or i + 1
        if not size and ended and not path.name.startswith("probe"):
            out.append(FileCheck(name, "empty", "this rank's steps are lost"))
            continue
        # event files only grow: shorter than what run.db read means it was cut, even where
        # the cut fell between two lines (nothing in the file itself shows it then)
        if size < read.get(path.name, 0):
            out.append(
                FileCheck(
                    name,
                    f"cut short: {size:,} bytes, but run.db read {read[path.name]:,} of it",
                    "the lines read before the cut are still in run.db",
                )
            )
            continue
        if bad:
            where = "of the last 4 MiB " if size > EVENT_TAIL_BYTES else ""
            out.append(
                FileCheck(
                    name,
                    f"{bad} line(s) {where}are not JSON objects (first: line {first})",
                    "those lines are skipped",
                )
            )
        else:
            out.append(FileCheck(name, None))
    return out


def event_ok(e: object) -> bool:
    """An event line as the schema says (docs/run-directory.md): an object with a string
    `kind`, an integer `rank`, and numbers (or null) where numbers go."""
    if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
        return False
    if not _is_int(e.get("rank")) or ("step" in e and not _is_int(e["step"])):
        return False
    return all(
        e.get(k) is None or _is_num(e[k])
        for k in ("t", "loss", "lr", "grad_norm", "tokens_per_s", "step_s")
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
