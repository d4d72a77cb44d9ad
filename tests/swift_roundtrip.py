"""Round trips of ms-swift commands through tunedeck, shared by tests/test_swift_roundtrip.py
and bench/swift_import_score.py:

  pasted command → `tunedeck import` (the spec file's text) → spec → `tunedeck export --format
  swift` (its text, split back into words) and `tunedeck launch --dry-run` (the plan's argv)

and what ms-swift's own HfArgumentParser makes of each (one child process for all of them).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.backends import plan_run
from tunedeck.core.backends.export import export
from tunedeck.core.backends.importer import import_command
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import loads_spec

# The judge is read from this checkout's files (ms-swift's parser through core/backends/swift/check.py
# run as a script, the flag table shipped beside it), never through the `tunedeck` being
# judged, so an older tunedeck can be scored by the same rules.
HERE = Path(__file__).resolve().parent.parent
CHECK = HERE / "core" / "backends" / "swift" / "check.py"
_TABLES: dict | None = None


def flag_tables() -> dict:
    global _TABLES
    if _TABLES is None:
        import importlib.metadata as md

        name = f"flags-v2-swift{md.version('ms-swift')}-tf{md.version('transformers')}.json.gz"
        path = HERE / "core" / "backends" / "swift" / "tables" / name
        if path.exists():
            _TABLES = json.loads(gzip.decompress(path.read_bytes()))
        else:
            _TABLES = json.loads(_run_check("--table", None))
    return _TABLES


def _run_check(mode: str, stdin: str | None) -> str:
    with tempfile.TemporaryDirectory() as cwd:  # no swift/ folder of anyone's in the way
        proc = subprocess.run(
            [sys.executable, str(CHECK), mode],
            input=stdin,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
    out = proc.stdout.rpartition("@@TUNEDECK@@")[2]
    if proc.returncode or not out:
        raise RuntimeError(f"ms-swift's parser: {proc.stderr[-800:]}")
    return out


def parser_check(jobs: list, values: bool = True) -> list[dict]:
    return json.loads(_run_check("--parse", json.dumps(jobs)))


def shell_words(text: str) -> list[str]:
    """Words of a pasted shell command: line continuations (backslash-newline outside single
    quotes) joined first, as the shell does; shlex alone would keep them as newline words."""
    out, quote, i = [], "", 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'" and text[i + 1 : i + 2] == "\n":
            i += 2
            continue
        if c == "\\" and quote != "'":
            out.append(text[i : i + 2])
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        out.append(c)
        i += 1
    return shlex.split("".join(out))


LAUNCHER_ENV = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Trip:
    command: str
    swift_command: str = ""  # sft, megatron-rlhf, ... ("" = not ms-swift)
    original: list[str] = field(default_factory=list)  # the ms-swift argv as pasted
    exported: list[str] = field(default_factory=list)  # export --format swift, after `swift sft`
    dry_run: list[str] = field(default_factory=list)  # the plan's argv after -m swift.cli.X
    export_env: dict[str, str] = field(default_factory=dict)
    procs: tuple[int, int] = (0, 0)  # (nproc_per_node, nnodes) of the plan
    warnings: list[str] = field(default_factory=list)
    error: str = ""  # where it stopped, one line


def exported_words(text: str) -> tuple[dict[str, str], list[str]]:
    """An `export --format swift` script read back as a shell would: its exported variables
    and its command (line continuations joined; a quoted word keeps its line breaks)."""
    env: dict[str, str] = {}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith(("#", "set ", "export ", "\n")):
        if lines[i].startswith("export "):
            k, _, v = lines[i][len("export ") :].strip().partition("=")
            env[k] = shlex.split(v)[0] if v else ""
        i += 1
    return env, shell_words("".join(lines[i:]))


def round_trip(
    command: str,
    swift_argv: list[str] | None = None,
    gpus: int = 8,
    tmp: str = "/tmp/tunedeck-roundtrip",
    spec_dir: Path | None = None,
) -> Trip:
    """`swift_argv`: the ms-swift flags of `command` as ms-swift sees them (the caller knows
    them; the scorer reads them from the command). `spec_dir`: write the spec file there and
    load it as `tunedeck export FILE` does (relative paths resolve from that folder), instead
    of reading its text in memory."""
    trip = Trip(command, original=list(swift_argv or []))
    try:
        imp = import_command(command)
    except ValueError as e:
        trip.error = f"import: {e}"
        return trip
    trip.warnings = imp.warnings
    try:
        if spec_dir is not None:
            from tunedeck.core.spec import load_spec

            with tempfile.NamedTemporaryFile(
                "w", suffix=".toml", dir=spec_dir, encoding="utf-8"
            ) as f:
                f.write(imp.to_toml())
                f.flush()
                spec = load_spec(f.name)
        else:
            spec = loads_spec(imp.to_toml(), source="<imported>")  # what `import -o` writes
    except ValueError as e:
        trip.error = f"load: {e}"
        return trip
    if spec.backend != "swift":
        trip.error = f"imported as a {spec.backend} run"
        return trip
    trip.swift_command = spec.swift.command
    from tunedeck.core.estimate.resolve import resolve

    try:
        resolved = resolve(spec, gpu_count=gpus)
        trip.procs = (resolved.cluster.nproc_per_node, resolved.cluster.nnodes)
        env, words = exported_words(export(resolved, "swift"))
        trip.export_env = env
        trip.exported = words[2:]  # after `swift sft` / `megatron rlhf`
        planned, plan = plan_run(spec, RunDir(tmp), gpu_count=gpus)
        argv = plan.nodes[0].argv
        i = next(i for i, w in enumerate(argv) if w.startswith("swift.cli."))
        trip.dry_run = argv[i + 1 :]
        trip.procs = (planned.cluster.nproc_per_node, planned.cluster.nnodes)
    except ValueError as e:
        trip.error = f"export/dry-run: {str(e).splitlines()[0]} {' '.join(str(e).splitlines()[1:])}"
    return trip


def parse_all(jobs: list[tuple[str, list[str]]]) -> list[dict]:
    """ms-swift's parser on every (command, argv) that it can load (not Megatron's, whose
    classes need megatron-core): the remaining argv, the error, every field's value. Megatron
    argvs are read with the flag table instead (`table_parse`)."""
    swift_jobs = [(i, c, a) for i, (c, a) in enumerate(jobs) if not c.startswith("megatron")]
    out: list[dict] = [{} for _ in jobs]
    if swift_jobs:
        res = parser_check([(c, a) for _, c, a in swift_jobs], values=True)
        for (i, _, _), r in zip(swift_jobs, res):
            out[i] = r
    for i, (c, a) in enumerate(jobs):
        if c.startswith("megatron"):
            out[i] = table_parse(c, a)
    return out


def table_parse(command: str, argv: list[str]) -> dict:
    """Megatron argv read the way argparse would with the flag table: {dest: words}, last
    flag wins; unknown flags in `remaining`."""
    known = flag_tables()["commands"][command]
    values: dict[str, object] = {}
    remaining: list[str] = []
    name = None
    for w in argv:
        if w.startswith("--") and len(w) > 2:
            flag, eq, v = w[2:].partition("=")
            info = known.get(flag)
            if info is None:
                remaining.append(w)
                name = None
                continue
            name = info["dest"]
            values[name] = [v] if eq else []
            if flag.startswith("no_") and info["type"] == "bool" and info["nargs"] == 0:
                values[name] = ["false"]
        elif name is not None:
            values[name].append(w)  # type: ignore[union-attr]
        else:
            remaining.append(w)
    bools = {i["dest"] for i in known.values() if i["type"] == "bool"}
    norm = {k: (True if v == [] and k in bools else _norm(v)) for k, v in values.items()}
    return {"remaining": remaining, "error": None, "values": norm}


def _norm(words) -> object:
    """Megatron words compared by meaning: numbers as numbers, true/false as booleans."""
    out = []
    for w in words:
        lw = w.lower()
        if lw in ("true", "false"):
            out.append(lw == "true")
            continue
        try:
            out.append(float(w))
        except ValueError:
            out.append(w)
    return out if len(out) != 1 else out[0]
