"""Every field of the installed ms-swift's argument classes survives tunedeck: a command that
sets it to a value unlike its default goes through `tunedeck import` (the spec file's text),
`export --format swift` and `launch --dry-run`, and ms-swift's own HfArgumentParser reads the
same value back from both (sft, pt, rlhf with every rlhf_type). Megatron's classes need
megatron-core, which is not installed: their fields are compared flag by flag through the
table read from ms-swift's source. The commands are generated from the flag table, so a new
ms-swift version tests its new fields."""

from __future__ import annotations

import shlex

import pytest

from tests.swift_roundtrip import flag_tables, parse_all, round_trip
from tunedeck.core.backends.swift.version import installed_version

pytestmark = pytest.mark.skipif(installed_version() is None, reason="ms-swift not installed")

BASE = {"model": ["org/base-model"]}
# fields that do not come back as written, each with the import warning or reason that says so
CREDENTIALS = {"hub_token", "api_key", "swanlab_token", "swanlab_secret"}  # never in a spec
# what a CPU run adds beside --use_cpu (tunedeck's resolve: fp32 on CPU; gloo for DDP)
ADDED_WITH = {"use_cpu": {"torch_dtype", "ddp_backend"}}


# fields whose type the flag table calls str but that take a value of their own shape
VALUES = {"debug": ["underflow_overflow"]}
# fields no command line can set (their parser type cannot be built from a word)
NOT_SETTABLE = {"parallelism_config", "liger_kernel_config"}


def non_default(name: str, info: dict) -> list[str]:
    """Words that set `name` to a value unlike ms-swift's default."""
    if name in VALUES:
        return VALUES[name]
    d, typ, choices = info.get("default"), info.get("type"), info.get("choices")
    if typ == "bool":
        return ["false" if d is True else "true"]
    if choices:
        return [next((c for c in choices if c not in (str(d), "None")), choices[0])]
    if info.get("nargs") in ("+", "*"):
        return {"int": ["3", "4"], "float": ["0.25", "0.5"]}.get(typ, ["alpha", "beta"])
    if typ == "int":
        return [str((d if isinstance(d, int) and not isinstance(d, bool) else 0) + 3)]
    if typ == "float":
        return ["0.37" if d != 0.37 else "0.41"]
    return [f"v-{name}"]


def cases(command: str) -> list[tuple[str, list[str]]]:
    """(field, the ms-swift argv that sets it) for every field of `command`."""
    known = flag_tables()["commands"][command]
    rlhf_types = known.get("rlhf_type", {}).get("choices") or []
    out = []
    for n, (name, info) in enumerate(sorted(known.items())):
        if name != info.get("dest") or name in NOT_SETTABLE:  # --no_x, --x-y spellings
            continue
        argv = [] if name in BASE else [f"--{k}" for k in BASE] + BASE["model"]
        if rlhf_types and name != "rlhf_type" and not command.startswith("megatron"):
            argv += ["--rlhf_type", rlhf_types[n % len(rlhf_types)]]  # every type in turn
        argv += [f"--{name}", *non_default(name, info)]
        out.append((name, argv))
    return out


CLI = {
    "sft": "swift sft",
    "pt": "swift pt",
    "rlhf": "swift rlhf",
    "megatron-sft": "megatron sft",
    "megatron-rlhf": "megatron rlhf",
}


@pytest.fixture(scope="module")
def trips():
    rows = []
    for command, cli in CLI.items():
        for name, argv in cases(command):
            trip = round_trip(f"NPROC_PER_NODE=2 {cli} {shlex.join(argv)}", argv)
            rows.append((command, name, trip))
    jobs = []
    for command, _, t in rows:
        jobs += [(command, t.original), (command, t.exported), (command, t.dry_run)]
    parsed = parse_all(jobs)
    return [(c, n, t, parsed[3 * i : 3 * i + 3]) for i, (c, n, t) in enumerate(rows)]


def _differences(name: str, a: dict, b: dict, ignore: set[str]) -> list[str]:
    keys = (set(a) | set(b)) - ignore
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(keys) if a.get(k) != b.get(k)]


def test_every_field_is_generated(trips):
    counts = {c: sum(1 for cc, *_ in trips if cc == c) for c in CLI}
    assert counts["sft"] > 300 and counts["rlhf"] > counts["sft"], counts
    assert counts["megatron-sft"] > 300, counts


def test_every_field_survives_import_export_and_dry_run(trips):
    failures = []
    for command, name, trip, (orig, exp, dry) in trips:
        if name in CREDENTIALS:
            # left out of the spec, with a warning naming the flag and the variable to use
            assert any(f"--{name}" in w and "secret" in w for w in trip.warnings), trip.warnings
            continue
        if trip.error:
            failures.append(f"{command} --{name}: {trip.error}")
            continue
        if orig.get("error") or orig.get("remaining"):
            failures.append(f"{command} --{name}: generated argv rejected: {orig}")
            continue
        for label, got, ignore in (
            ("export", exp, set()),
            ("dry-run", dry, {"output_dir"} - {name}),
        ):
            if got.get("error") or got.get("remaining"):
                failures.append(
                    f"{command} --{name} {label}: {got.get('error')} {got.get('remaining')}"
                )
                continue
            diff = _differences(
                name, orig["values"], got["values"], ignore | ADDED_WITH.get(name, set())
            )
            if diff:
                failures.append(f"{command} --{name} {label}: {'; '.join(diff)}")
    assert failures == [], f"{len(failures)} fields changed:\n" + "\n".join(failures[:40])


def test_processes_survive(trips):
    assert {t.procs for _, n, t, _ in trips if not t.error} == {(2, 1)}
