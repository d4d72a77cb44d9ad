"""Score `tunedeck import` on example-shaped ms-swift commands (tests/swift_cases/commands.sh).

    .venv/bin/python bench/swift_import_score.py [-v] [--cases FILE]

Each case goes through import (the spec file's text), `export --format swift` and `launch
--dry-run` (tests/swift_roundtrip.py), and ms-swift's own argument parser reads the pasted
command, the exported one and the dry-run's argv (one child process for all; Megatron's argvs
through the flag table ms-swift's source gives, since its classes need megatron-core). Prints
the five numbers of issue 14:

  imported        the command became a spec (the rest: refused, with the reason)
  keeps           every field the original sets has the same value in the export
  adds nothing    every field the export sets that the original did not is at ms-swift's default
  parser          the dry-run's argv passes ms-swift's parser (no error, nothing left over)
  processes       processes per node and nodes as the original (the case's header)

The original is read here independently of the importer: the words after `swift|megatron
SUBCOMMAND`, `-m swift ...` or `swift/cli/X.py`, a config file expanded as ms-swift's launcher
does, and flag renames the import's warnings name (3.x and Megatron-LM names) applied.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.swift_roundtrip import flag_tables, parse_all, round_trip, shell_words  # noqa: E402
from tunedeck.core.backends.swift.flags import FIXES_4X  # noqa: E402

CASES = REPO / "tests" / "swift_cases" / "commands.sh"
HEADER = re.compile(r"^## (\S+)(.*)$")


def read_cases(path: Path) -> list[dict]:
    cases: list[dict] = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        m = HEADER.match(line)
        if m:
            attrs = dict(kv.split("=", 1) for kv in m.group(2).split())
            cases.append({"name": m.group(1), "text": "", **attrs})
        elif cases and not (line.startswith("#") and not cases[-1]["text"]):
            cases[-1]["text"] += line
    for c in cases:
        c["text"] = c["text"].strip()
    return cases


def original(text: str) -> tuple[str, list[str]]:
    """(ms-swift command, its argv) of a pasted command, as ms-swift would read it."""
    words = shell_words(text)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.S):
        words.pop(0)
    for i, w in enumerate(words):
        prev = words[i - 1] if i else ""
        m = re.search(r"swift/cli/(_megatron/)?(sft|pt|rlhf)\.py$", w)
        if m:
            return ("megatron-" if m.group(1) else "") + m.group(2), words[i + 1 :]
        if w in ("swift.cli.sft", "swift.cli.pt", "swift.cli.rlhf") and prev == "-m":
            return w.rsplit(".", 1)[1], words[i + 1 :]
        if w in ("sft", "pt", "rlhf") and prev in ("swift", "megatron"):
            mega = prev == "megatron"
            return ("megatron-" if mega else "") + w, expand_config(words[i + 1 :])
    raise ValueError("no ms-swift command found")


def expand_config(argv: list[str]) -> list[str]:
    """`swift sft x.yaml ...`: the file's keys as flags (ms-swift's cli/main.py does this)."""
    if not argv or not argv[0].endswith((".yaml", ".yml", ".json")):
        return argv
    import yaml

    conf = yaml.safe_load(Path(argv[0]).read_text(encoding="utf-8"))
    conf.pop("ENV", None)
    words: list[str] = []
    for k, v in conf.items():
        words.append(f"--{k}")
        if isinstance(v, list):
            words += [str(x) for x in v]
        else:
            words.append(json.dumps(v) if isinstance(v, dict) else str(v))
    return words + argv[1:]


def apply_renames(argv: list[str], known: dict) -> list[str]:
    """Flags the installed ms-swift no longer has, renamed as the import's warning says (a
    removed one dropped, with its values)."""
    out: list[str] = []
    value_map: dict[str, str] = {}
    dropping = False
    for w in argv:
        if w.startswith("--"):
            name, eq, val = w[2:].partition("=")
            fix = FIXES_4X.get(name) if name not in known else None
            value_map, dropping = {}, False
            if fix is not None and fix.flag:
                name, value_map = fix.flag, dict(fix.value_map)
            elif fix is not None:
                dropping = True
                continue
            out.append(f"--{name}" + (f"={value_map.get(val, val)}" if eq else ""))
        elif not dropping:
            out.append(value_map.get(w, w))
    return out


def explicit_dests(argv: list[str], known: dict) -> set[str]:
    dests = set()
    for w in argv:
        if w.startswith("--"):
            name = w[2:].partition("=")[0]
            info = known.get(name)
            if info is None:  # an abbreviation argparse accepts
                longer = [k for k in known if k.startswith(name)]
                info = known[longer[0]] if len(longer) == 1 else None
            if info is not None:
                dests.add(info["dest"])
    return dests


def same(a, b) -> bool:
    """Equal, or the same local file: a relative path the spec file resolved against its own
    folder (the folder the command ran in) names the same file as written."""
    if a == b:
        return True
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and os.path.isabs(b) and not os.path.isabs(a):
        local = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(a)))
        looks_local = (
            a.startswith(("./", "../", "~"))
            or a.lower().endswith((".jsonl", ".json", ".csv", ".txt", ".parquet"))
            or os.path.exists(local)
        )
        return looks_local and local == b  # a hub id (`org/name#500`) is never a path
    return False


def score(cases: list[dict], verbose: bool, one_line: bool = False) -> dict:
    tables = flag_tables()
    rows = []
    for c in cases:
        row = {
            "name": c["name"],
            "procs": (int(c.get("procs", 0)), int(c.get("nodes", 1))),
            "refuse": c.get("refuse", ""),
        }
        try:
            command, argv = original(c["text"])
            known = tables["commands"][command]
            row["command"], row["argv"] = command, apply_renames(argv, known)
        except (ValueError, KeyError, OSError) as e:
            row["command"], row["argv"] = "", []
            row["why"] = f"scorer: {e}"
        pasted = c["text"]
        if one_line:  # as one line, line continuations already joined by a shell
            import shlex

            pasted = shlex.join(shell_words(pasted))
        row["trip"] = round_trip(pasted, row["argv"], spec_dir=Path.cwd())
        rows.append(row)
    jobs = []
    for r in rows:
        t, cmd = r["trip"], r["command"] or "sft"
        jobs += [(cmd, r["argv"]), (cmd, t.exported), (cmd, t.dry_run)]
    parsed = parse_all(jobs)
    totals = {
        "cases": len(rows),
        "imported": 0,
        "refused_with_reason": 0,
        "keeps": 0,
        "adds_nothing": 0,
        "parser": 0,
        "processes": 0,
        "orig_parses": 0,
        "parser_of_ok": 0,
    }
    for i, r in enumerate(rows):
        t = r["trip"]
        orig, exp, dry = parsed[3 * i : 3 * i + 3]
        if t.error.startswith("import:"):
            if r["refuse"] and r["refuse"] in t.error:
                totals["refused_with_reason"] += 1
            r["fail"] = [t.error]
            continue
        if t.error:
            r["fail"] = [t.error]
            imported = not t.error.startswith(("load:", "imported as"))
            o = parsed[3 * i]
            totals["orig_parses"] += imported and not o.get("error") and not o.get("remaining")
            totals["imported"] += imported
            totals["processes"] += imported and t.procs == r["procs"]  # the spec holds them
            continue
        totals["imported"] += 1
        known = tables["commands"][r["command"]]
        set_orig = explicit_dests(r["argv"], known)
        set_exp = explicit_dests(t.exported, known)
        ov, ev = orig.get("values", {}), exp.get("values", {})
        fails = []
        changed = [
            f"{d}: {ov.get(d)!r} -> {ev.get(d)!r}"
            for d in sorted(set_orig)
            if not same(ov.get(d), ev.get(d))
        ]
        added = [
            f"{d}: {ev.get(d)!r} (default {ov.get(d)!r})"
            for d in sorted(set_exp - set_orig)
            if ov.get(d) != ev.get(d)
        ]
        if orig.get("error") or orig.get("remaining"):
            changed.append(f"(the original itself: {orig.get('error')} {orig.get('remaining')})")
        totals["keeps"] += not changed
        totals["adds_nothing"] += not added
        ok_parser = not dry.get("error") and not dry.get("remaining")
        totals["parser"] += ok_parser
        orig_ok = not orig.get("error") and not orig.get("remaining")
        totals["orig_parses"] += orig_ok
        totals["parser_of_ok"] += ok_parser and orig_ok
        totals["processes"] += t.procs == r["procs"]
        if changed:
            fails.append("changed " + "; ".join(changed))
        if added:
            fails.append("added " + "; ".join(added))
        if not ok_parser:
            fails.append(f"dry-run parse: {dry.get('error')} {dry.get('remaining')}")
        if t.procs != r["procs"]:
            fails.append(f"processes {t.procs} != {r['procs']}")
        r["fail"] = fails
    if verbose:
        for r in rows:
            for f in r.get("fail", []):
                print(f"  {r['name']}: {f}")
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument(
        "--one-line",
        action="store_true",
        help="paste each command as one line (continuations joined)",
    )
    a = ap.parse_args()
    path = Path(a.cases).resolve()
    os.chdir(path.parent)  # config files and hostfiles are named from there
    t0 = time.monotonic()
    cases = read_cases(path)
    tot = score(cases, a.verbose, a.one_line)
    n, imp = tot["cases"], tot["imported"]

    def pct(k: int, d: int) -> str:
        return f"{k}/{d} = {100 * k / d:.1f} %" if d else "-"

    print(f"cases: {n} ({Path(a.cases).name}), {time.monotonic() - t0:.1f} s")
    print(
        f"imported:                          {pct(imp, n)} (refused with the expected "
        f"reason: {tot['refused_with_reason']})"
    )
    print(f"export keeps every flag and value: {pct(tot['keeps'], imp)}")
    print(f"export adds no flag (off default): {pct(tot['adds_nothing'], imp)}")
    print(
        f"dry-run passes ms-swift's parser:  {pct(tot['parser'], imp)} (of the commands "
        f"ms-swift's parser accepts as pasted: {pct(tot['parser_of_ok'], tot['orig_parses'])})"
    )
    print(f"same processes and nodes:          {pct(tot['processes'], imp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
