"""What every backend is: a pure plan builder plus the agent's monitors for its runs.

A backend turns a resolved RunSpec into a LaunchPlan (argv/env per node) without side
effects: no model is built, no file written (reading files, such as the demo data to name
its model folder or ms-swift's flag table, is allowed), so a dry run, an export and the
preflight see exactly the plan a launch would start. Anything a run needs built first is
done by the agent before torchrun starts (`tunedeck.core.supervisor.agent`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from tunedeck.core.backend_traits import Traits, traits_of
from tunedeck.core.backends.importing import Importer
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.monitoring import Monitor
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import step_of
from tunedeck.core.spec import RunSpec


def _no_monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    return []


def _no_checks(spec: RunSpec, local: bool) -> None:
    return None


@dataclass(frozen=True)
class Restart:
    """Where a restarted attempt continues. `checkpoint` None: from step 0, or the backend
    cannot tell; `note` says which for the agent's restart message ("" when it cannot tell);
    how the trainer is told: `flag` (ms-swift's) or the variable `var` (a user's script, the
    LLaMA-Factory boot), or neither when it looks for itself (the built-in trainer); `how`
    says who reads `var`, for the note."""

    checkpoint: Path | None
    note: str
    flag: str = ""
    var: str = ""

    @classmethod
    def at(cls, path: Path | None, flag: str = "", var: str = "", how: str = "") -> Restart:
        if path is None:
            return cls(None, "from step 0: no checkpoint written yet", flag, var)
        return cls(path, f"from {path.name}" + (f" ({how})" if how else ""), flag, var)

    @property
    def step(self) -> int:
        """The step the attempt goes on after (0: from the start, or not known)."""
        return step_of(self.checkpoint) if self.checkpoint else 0

    def environ(self) -> dict[str, str]:
        return {self.var: str(self.checkpoint)} if self.var and self.checkpoint else {}

    def argv(self, argv: list[str]) -> list[str]:
        """The attempt's command: the flag with this checkpoint replaces any the plan had."""
        if not self.flag or self.checkpoint is None:
            return argv
        out: list[str] = []
        skip = False
        for w in argv:
            if skip:
                skip = False
            elif w == self.flag:
                skip = True
            elif not w.startswith(self.flag + "="):
                out.append(w)
        return out + [self.flag, str(self.checkpoint)]


def _restart_unknown(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    return Restart(None, "")


def _nothing(spec: RunSpec) -> list:
    return []


def _none(spec: RunSpec) -> None:
    return None


def _no_defaults(spec: RunSpec) -> dict:
    return {}


def _not_bound(spec: RunSpec) -> bool:
    return False


def _as_written(spec: RunSpec) -> tuple[RunSpec, list[str]]:
    return spec, []


@dataclass(frozen=True)
class Exported:
    """A run as a user would start it by hand (`tunedeck export --format <name>`): the files
    the command reads (name → text, written next to where it runs), its environment and argv.
    tunedeck's export masks secrets and writes it out as one shell script."""

    env: dict[str, str]
    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """One backend, everything callers ask of it (docs/adding-a-backend.md). Its name is a
    key of `tunedeck.core.backend_traits.TRAITS`, where the facts the layers below the
    backends need (spec rules, the estimator's model) are kept: `traits`."""

    name: str
    # spec (resolved) + run directory → plan; pure
    build_plan: Callable[[RunSpec, RunDir], LaunchPlan]
    # raises ValueError for a spec this backend cannot run; `local`: also what must hold on
    # this machine (a script file that exists here), off for exports to other machines
    check: Callable[[RunSpec, bool], None] = _no_checks
    # the monitors a run of this backend adds on this node (they turn its logs into events)
    monitors: Callable[[RunDir, RunSpec], list[Monitor]] = _no_monitors
    # what an attempt after the first continues from, once the one before it has ended
    restart: Callable[[RunSpec, RunDir, int], Restart] = _restart_unknown
    # what the run needs installed beyond torch's own: (distribution, minimal version, why)
    requirements: Callable[[RunSpec], list[tuple[str, str, str]]] = _nothing
    # the output folder the spec's own flags for the trainer name (ms-swift's --output_dir
    # in swift.extra_args), which wins over tunedeck's; None: tunedeck's
    user_output_dir: Callable[[RunSpec], str | None] = _none
    # the variable the trainer is told its resume checkpoint in ("": it finds it itself)
    resume_var: str = ""
    # -- import and export --
    # how `tunedeck import` reads this backend's commands (None: it reads none)
    importer: Importer | None = None
    # its own `tunedeck export --format NAME` forms: NAME → (the spec, resolved; the output
    # folder the user named) → the command a user would type for the run
    exports: dict[str, Callable[[RunSpec, str | None], Exported]] = field(default_factory=dict)
    # where a checkpoint lands below the output folder, before `checkpoint-<step>` (ms-swift
    # nests them in a versioned `v<N>-<time>/` folder: "v*-*/")
    checkpoint_glob_prefix: str = ""
    # a line the vLLM export adds for this backend's checkpoints ("": none)
    serve_note: str = ""
    # how the backend's own tool merges an adapter checkpoint into its base, as its users do
    # it (`tunedeck export-model --merge`): (checkpoint, new folder, torch dtype name) → argv,
    # run without a shell; None: tunedeck merges with peft
    merge_command: Callable[[Path, Path, str], list[str]] | None = None
    # -- the numbers (the estimate, preflight, the compose form, the dry run) --
    # the spec as the backend runs it, for the numbers only (never for a plan; the
    # backend's own defaults in place of unset keys), and what the figures had to assume
    as_run: Callable[[RunSpec], tuple[RunSpec, list[str]]] = _as_written
    # resolve the spec before `as_run` (the backend's defaults depend on the ranks)
    resolve_for_estimate: bool = False
    # how long the run trains, in words, for the preview's summary (None: its steps)
    length_words: Callable[[RunSpec], str] | None = None
    # the trainer's settings and where each value comes from (dry run, compose pane)
    run_settings: Callable[[RunSpec], list[dict]] = _nothing
    # each setting the spec leaves to the backend: (value or None, where it comes from)
    run_defaults: Callable[[RunSpec], dict] = _no_defaults
    # the figures are sized at the backend's length limit, not a length the user chose
    length_is_bound: Callable[[RunSpec], bool] = _not_bound
    # how long the run trains when the spec does not say it in steps (None: its steps)
    length_unless_steps: Callable[[RunSpec], str | None] = _none
    # switches that would make this run faster, not used yet: [{flag, value, gain, why}]
    # (the estimate's advice)
    speed_flags: Callable[[RunSpec], list[dict]] = _nothing
    # -- the compose form --
    # spec keys the backend's own parser sets: left unset, the backend's own default applies
    # (the form shows an empty box and, dim, that default)
    own_keys: frozenset[str] = frozenset()
    # what must be read once before a preview (blocking): '' or why it could not be; None:
    # nothing. `warm_note` says what the wait is for.
    warm: Callable[[], str] | None = None
    warm_note: str = ""

    @property
    def traits(self) -> Traits:
        """The facts kept below the backends (core/backend_traits.py) for this one."""
        return traits_of(self.name)
