"""What a spec will do, before anything starts: the exact launch script and the batch math.

Used by `tunedeck launch --dry-run` and the TUI's presets screen; `ps_warning` is the line the
compose screen's side pane shows under a plan whose argv holds a secret; `swift_settings` (and
`Preview.settings`) the value each ms-swift setting takes and where it comes from: the spec,
swift.extra_args, or ms-swift's own default for the installed version (a key the spec does not
set emits no flag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.backends import backend_of, plan_run
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.estimate.batch import describe, effective_batch
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec, mask_argv


@dataclass
class Preview:
    spec: RunSpec  # resolved for this machine
    script: str  # launch.sh for node 0 (secrets masked)
    world_size: int
    effective_batch: int
    summary: str  # one paragraph for people
    warning: str = ""  # ps_warning: secrets the command line itself will carry
    settings: list[dict] = field(default_factory=list)  # swift_settings (ms-swift runs)


def ps_warning(plan: LaunchPlan) -> str:
    """ "" or one line naming the credential flags left in the command line: every local user
    sees a process's argv (`ps`, /proc/<pid>/cmdline) for as long as it runs. Secrets in the
    environment (env.NAME, ms-swift's --hub_token/--swanlab_token, moved there by the swift
    backend) are private to the run's owner."""
    flags: list[str] = []
    for node in plan.nodes:
        prev = ""
        for word, shown in zip(node.argv, mask_argv(node.argv)):
            if word != shown:
                flag = shown.partition("=")[0] if shown != "****" else prev
                if flag not in flags:
                    flags.append(flag)
            prev = word
    if not flags:
        return ""
    return (
        f"warning: `ps` shows every local user the command line, and with it the value of "
        f"{', '.join(flags)}: pass secrets as environment variables (env.NAME; masked in "
        f"the run's files and kept in its private secrets file) where the program reads one"
    )


def swift_settings(spec: RunSpec) -> list[dict]:
    """[{"key", "flag", "value", "source"}] for each ms-swift setting the spec's command has a
    key for: "spec" (it emits the flag), "extra_args" (written there, as is), or "ms-swift X
    default" (no flag: ms-swift's default for the installed version X, read from its own
    argument classes; None where the default is decided at run time, e.g. learning_rate by
    tuner). Empty for other backends."""
    from tunedeck.core.backends.run_estimate import run_settings

    # the same values the compose form and the estimate use (the model's length limit, the
    # accumulation to a global batch of 16 where the table says "at run time")
    return run_settings(spec)


def settings_lines(rows: list[dict]) -> list[str]:
    """`swift_settings` as lines for a terminal: `--flag value  (source)`."""
    out = []
    for r in rows:
        v = r["value"]
        value = (
            "(as written there)"
            if r["source"] == "extra_args"
            else "(decided at run time)"
            if v is None
            else " ".join(map(str, v))
            if isinstance(v, list)
            else str(v)
        )
        out.append(f"--{r['flag']} {value}  ({r['source']}: {r['key']})")
    return out


def preview(spec: RunSpec, root: Path | None = None) -> Preview:
    spec, plan = plan_run(spec, RunDir((root or runs_root()) / "<run-id>"))
    t, c = spec.train, spec.cluster
    est, length = spec, f"{t.max_steps} steps"
    numbers = backend_of(spec).preview_numbers
    if numbers is not None:  # the numbers of the run the backend starts (its defaults)
        est, length = numbers(spec)
    eff = effective_batch(est, plan.world_size)  # data-parallel only (Megatron divides)
    where = f"{c.nnodes} node(s) x {c.nproc_per_node} {c.device.upper()} rank(s), {c.dist_backend}"
    summary = (
        f"{spec.name}: {spec.backend} backend, {est.method.type} on {spec.model.path}; "
        f"{where}; {spec.parallel.strategy}. {describe(est, plan.world_size)}"
        f"; {length}."
    )
    return Preview(
        spec,
        plan.to_shell(c.node_rank),
        plan.world_size,
        eff,
        summary,
        ps_warning(plan),
        swift_settings(spec),
    )
