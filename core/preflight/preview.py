"""What a spec will run, before anything starts: the one answer `tunedeck launch --dry-run` and
the compose screen's side pane both render.

`preview` plans the spec as a launch would (`plan_run`, the port pinned as the launch will use
it), and says, as data: the launch script (secrets masked), the run-as spec, the batch math,
the memory estimate of the run it starts and its verdict on each GPU (`gpu_fits`, the same
verdicts preflight's memory check reads), the value of each ms-swift setting and where it
comes from, and what the user should know (`ps_warning`). Nothing is written and nothing
starts; it blocks on NVML, ms-swift's flag table and the model's config, so a UI calls it in a
worker.
"""

from __future__ import annotations

from tunedeck.core.backend_traits import traits_of

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.backends import backend_of, plan_run
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.estimate.batch import describe, effective_batch
from tunedeck.core.estimate.resolve import pin_port
from tunedeck.core.paths import runs_root
from tunedeck.core.preflight.base import CheckResult, Context
from tunedeck.core.preflight.config import GpuFit, check_gpu_memory, gpu_fits
from tunedeck.core.preflight.gpu import chosen
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec, mask_argv
from tunedeck.core.telemetry.gpus import GpuFacts


@dataclass
class Preview:
    spec: RunSpec  # as it runs: resolved for this machine, the port pinned
    plan: LaunchPlan
    script: str  # launch.sh for this node (secrets masked)
    port: int  # the rendezvous port the launch uses
    port_note: str  # where the port comes from
    port_picked: bool  # cluster.master_port = 0 on one node: `port` was picked for it
    world_size: int
    effective_batch: int
    batch: str  # "effective batch 16 = 1 per device x 2 data-parallel x 8 accumulation"
    length: str  # "300 steps", "3 epochs (ms-swift X default)"
    summary: str  # one paragraph for people
    estimate: Any  # SpecEstimate of the run the spec starts, or why there is none (str)
    memory: CheckResult  # preflight's memory check on these GPUs (its status is the verdict)
    gpus: list[GpuFit] = field(default_factory=list)  # the verdict on each GPU the run uses
    settings: list[dict] = field(default_factory=list)  # swift_settings (ms-swift runs)
    warnings: list[str] = field(default_factory=list)  # ps_warning, for now

    @property
    def fit(self) -> str:
        """pass | warn | fail | skip: the memory estimate against the GPUs."""
        return self.memory.status

    @property
    def memory_line(self) -> str:
        """The estimate in one line ("memory ≈ 12.3 GiB per GPU (peak at backward)")."""
        est = self.estimate
        if isinstance(est, str):
            return f"memory: no estimate: {est.split(';')[0]}"
        per = est.memory.per_gpu_gib
        if self.spec.cluster.device != "cuda":
            return (
                f"memory ≈ {per:.2f} GiB per process ({self.spec.cluster.device}; "
                "no GPU to compare with)"
            )
        return f"memory ≈ {per:.1f} GiB per GPU (peak at {est.memory.peak_phase})"

    @property
    def gpu_lines(self) -> list[tuple[str, str]]:
        """[(line, status)]: the verdict on each GPU the run uses, or that there is none to
        compare with; empty without an estimate or off CUDA."""
        if isinstance(self.estimate, str) or self.spec.cluster.device != "cuda":
            return []
        if not self.gpus:
            return [("no GPU here to compare with", "skip")]
        return [(g.line, g.fit.status) for g in self.gpus]


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


def setting_value(row: dict) -> str:
    """The value of a `swift_settings` row as ms-swift's command line spells it."""
    v = row["value"]
    if row["source"] == "extra_args":
        return "(as written in swift.extra_args)"
    if v is None:
        return "decided at run time"
    if isinstance(v, list):
        return " ".join(map(str, v)) or "none"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def is_default(row: dict) -> bool:
    """Whether the row's value is ms-swift's own (the spec leaves the key unset)."""
    return row["source"].startswith("ms-swift")


def settings_lines(rows: list[dict]) -> list[str]:
    """`swift_settings` as text: `--flag value  (key: source)`, the one way both the dry run
    and the compose pane write a row."""
    return [f"--{r['flag']} {setting_value(r)}  ({r['key']}: {r['source']})" for r in rows]


def port_note(spec: RunSpec) -> str:
    """Where the rendezvous port of `spec` (as written) comes from."""
    c = spec.cluster
    if c.master_port:
        return "cluster.master_port"
    if c.nnodes == 1:
        return "picked now for cluster.master_port = 0"
    return (
        "cluster.master_port = 0 on several nodes: the default, which every node must be "
        "able to reach"
    )


def preview(
    spec: RunSpec,
    facts: GpuFacts | None = None,
    *,
    port: int | None = None,
    root: Path | None = None,
) -> Preview:
    """What `spec` will run on a machine whose GPUs are `facts` (None: probe this one's; a
    cpu spec probes nothing). `port`: the port kept for a single-node spec that leaves
    cluster.master_port = 0 (None: a free one now). Raises what `plan_run` raises (ValueError
    naming the key, FlagTableError) when the spec cannot run."""
    if facts is None and spec.cluster.device == "cpu":
        facts = GpuFacts(error="cluster.device = cpu")
    note, picked = port_note(spec), spec.cluster.master_port == 0 and spec.cluster.nnodes == 1
    spec = pin_port(spec, port)
    ctx = Context(spec=spec, resolved=spec, gpu_probe=None if facts is None else lambda: facts)
    gpus = chosen(ctx)
    resolved, plan = plan_run(spec, RunDir((root or runs_root()) / "<run-id>"), gpu_count=len(gpus))
    ctx.resolved = resolved
    c = resolved.cluster
    run = ctx.run  # the numbers of the run it starts (ms-swift's defaults where unset)
    length = f"{run.train.max_steps} steps"
    words = backend_of(resolved).length_words
    if words is not None:  # the length as the backend's own defaults make it
        length = words(resolved)
    batch = describe(run, plan.world_size)  # data-parallel only (Megatron divides)
    where = f"{c.nnodes} node(s) x {c.nproc_per_node} {c.device.upper()} rank(s), {c.dist_backend}"
    # the fp8 frozen base changes the numbers a fine-tune ends with: the summary says so
    on = traits_of(resolved.backend).fp8_base and run.method.type == "lora" and run.method.fp8_base
    fp8 = " with the frozen base in fp8" if on else ""
    summary = (
        f"{resolved.name}: {resolved.backend} backend, {run.method.type}{fp8} on "
        f"{resolved.model.path}; {where}; {resolved.parallel.strategy}. {batch}; {length}."
    )
    warning = ps_warning(plan)
    return Preview(
        spec=resolved,
        plan=plan,
        script=plan.to_shell(c.node_rank),
        port=c.master_port,
        port_note=note,
        port_picked=picked,
        world_size=plan.world_size,
        effective_batch=effective_batch(run, plan.world_size),
        batch=batch,
        length=length,
        summary=summary,
        estimate=ctx.estimate,
        memory=check_gpu_memory(ctx),
        gpus=gpu_fits(ctx),
        settings=swift_settings(resolved),
        warnings=[warning] if warning else [],
    )
