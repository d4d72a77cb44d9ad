"""The custom-script backend: torchrun runs the user's own training script or module (HF
Trainer, accelerate, plain torch), and the agent turns what rank 0 prints into step events.

A user script knows nothing of tunedeck, so metrics come from its console, read by the ingest
parsers: HF Trainer log dicts (`{'loss': '6.893', 'learning_rate': ...}`; string values in
transformers 5), tqdm bars (`12/100 [..., loss=1.2]`) and `step N loss X` prints; its data
stage's bars (`Running tokenizer on dataset`, `Map`) become "tokenizing" phase events. The agent is
the only writer of `events/rank0.jsonl` for these runs; the ranks never open it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tunedeck.core.backends.base import Backend, Monitor, Restart
from tunedeck.core.backends.importing import Cluster, Env, Imported, Importer, drop_secrets
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import torchrun_plan
from tunedeck.core.ingest.dataphase import DataPhase
from tunedeck.core.ingest.metrics import MetricsParser
from tunedeck.core.ingest.parsers import LineAssembler, parse_metrics_line
from tunedeck.core.ingest.tail import RankLogTail
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.rundir.events import EventWriter, from_record
from tunedeck.core.spec import RunSpec


RESUME_VAR = "TUNEDECK_RESUME_FROM"


def script_path(spec: RunSpec) -> Path:
    """Absolute script path. Ranks run in the run directory, so a relative path is taken
    from where tunedeck is invoked, as torchrun itself would."""
    return Path(spec.script.path).expanduser().resolve()


def script_target(spec: RunSpec) -> list[str]:
    s = spec.script
    if s.module:
        return ["-m", s.module, *s.args]
    path = script_path(spec)
    return [str(path) if path.is_file() else s.path, *s.args]


def check(spec: RunSpec, local: bool) -> None:
    s = spec.script
    if s.path and s.module:
        raise ValueError("script.path and script.module are exclusive; set one")
    if local and s.path and not script_path(spec).is_file():
        # a spec file's relative paths were resolved from its folder when it was loaded;
        # only a path still relative (a spec built in code) is taken from here
        where = (
            ""
            if Path(s.path).expanduser().is_absolute()
            else f" (relative paths are taken from {Path.cwd()})"
        )
        raise ValueError(f"script.path: {script_path(spec)} is not a file{where}")


def build_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    # scripts that follow tunedeck's spec can read where outputs go, and where to resume from
    # (train.resume_from, as `tunedeck resume` sets it; a restart passes its own)
    out = run.output_dir(spec)
    env = {"TUNEDECK_OUTPUT_DIR": str(out)}
    if spec.train.resume_from:
        found = resume_point(spec.train.resume_from, out, 0)
        if found is not None:
            env[RESUME_VAR] = str(found)
    return torchrun_plan(spec, run, script_target(spec), env)


# -- metrics -----------------------------------------------------------------------------


def _hint_logging_steps(args: list[str]) -> int:
    for i, a in enumerate(args):
        val = (
            a.split("=", 1)[1]
            if a.startswith("--logging_steps=")
            else (args[i + 1] if a == "--logging_steps" and i + 1 < len(args) else None)
        )
        if val and val.isdigit() and int(val) > 0:
            return int(val)
    return 1


def from_step(run: RunDir) -> int:
    """The step the run's newest attempt resumed after (the agent records it at launch)."""
    launches = (run.read_state() or {}).get("launches") or [{}]
    step = launches[-1].get("from_step") if isinstance(launches[-1], dict) else None
    return step if isinstance(step, int) and step > 0 else 0


class ConsoleMonitor:
    """Step events from rank 0's console (stdout and stderr of its newest attempt). HF dicts
    carry no step number: the n-th is step n x --logging_steps (from the script's args,
    default 1). Progress bars count only when they show a loss (not "Loading weights 50/50")
    and the script prints no metric records of its own."""

    def __init__(
        self, run: RunDir, rank: int = 0, logging_steps: int = 1, timeout_s: float | None = None
    ):
        self.writer = EventWriter(run.path, rank, dedupe_steps=True)
        self.tail = RankLogTail(run, rank)
        self.logging_steps = max(int(logging_steps), 1)
        self.data = DataPhase(timeout_s)  # the collective timeout the data stage must beat
        # an agent adopting a restarted attempt reads it from its start: count from its step
        self._start_at(from_step(run))

    def parse(self, lines: list[str]) -> None:
        """Physical lines (`\r`-glued bar redraws and wrapped dicts are handled)."""
        self._feed(LineAssembler().feed_lines(lines))

    def _feed(self, lines: list[str], redraws: list[str] | None = None) -> None:
        """`redraws`: bars still running (not yet ended by a newline), for the data phase."""
        phase = self.data.feed([*lines, *(redraws or [])], time.time())
        if phase is not None:
            self.writer.emit("phase", step=self.writer.last_step, **phase)
            if "warning" in phase:
                logging.getLogger("tunedeck.agent").warning("rank 0: %s", phase["warning"])
        p = self.parser
        for line in lines:
            got = parse_metrics_line(line)
            if got is None:
                continue
            bar_before = p.bar_step
            rec = p.normalise(*got)
            if rec is not None:
                ev = from_record(rec)
                if ev:
                    self.saw_records = True
                    self.writer.emit(**ev)
            elif got[0] == "tqdm" and p.bar_step != bar_before and not self.saw_records:
                ev = from_record(p.progress.get(p.bar_step) or {})
                if ev and ev["step"] > self.writer.last_step:
                    self.writer.emit(**ev)

    def tick(self, now: float, new_events: list) -> None:
        self._feed(self.tail.logical_lines(), self.tail.redraws())

    def restarted(self, step: int) -> None:
        """The attempt that ended is read to its last line; the next one's HF dicts count on
        from the step it resumes after, and its repeats of earlier steps replace them."""
        self._feed(self.tail.logical_lines())
        self._start_at(step)

    def _start_at(self, step: int) -> None:
        self.parser = MetricsParser(logging_steps=self.logging_steps)
        self.parser.counted = step // self.logging_steps
        self.parser.last_step = step
        self.saw_records = False
        self.writer.restart_at(step)

    def close(self, new_events: list) -> None:
        self._feed(self.tail.logical_lines())
        self.writer.close()


def monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    """Rank 0 lives on node 0: only that node's agent reads its console."""
    if spec.cluster.node_rank != 0:
        return []
    # torch's own default when the spec sets none (10 min)
    timeout = spec.cluster.collective_timeout_s or 600
    return [ConsoleMonitor(run, 0, _hint_logging_steps(spec.script.args), timeout)]


def import_target(
    out: Imported, module: str, words: list[str], cluster: Cluster, env: Env, launcher: str
) -> bool:
    """Any script or module a launcher runs that no other backend claims."""
    if module:
        out.raw.update(
            backend="script",
            script={"module": module, "args": drop_secrets(out, words, "script.args")},
        )
        return True
    args = drop_secrets(out, words[1:], "script.args")
    out.raw.update(backend="script", script={"path": words[0], "args": args})
    if args:
        out.notes.append("script arguments are passed unchanged (script.args)")
    return True


def restart(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    """A restarted script is told the last checkpoint written into its output folder
    (checkpoint-<step>/ with trainer_state.json, as HF Trainer writes) in TUNEDECK_RESUME_FROM,
    e.g. `trainer.train(resume_from_checkpoint=os.environ.get("TUNEDECK_RESUME_FROM"))`; on
    several nodes the head's reading, which every node follows (core/supervisor/restarts)."""
    path = resume_point(spec.train.resume_from, run.output_dir(spec), attempt)
    return (
        Restart.at(path, var=RESUME_VAR, how=f"{RESUME_VAR} for the script")
        if path
        else Restart(None, "", var=RESUME_VAR)
    )


BACKEND = Backend(
    "script",
    build_plan,
    check,
    monitors,
    restart,
    resume_var=RESUME_VAR,
    importer=Importer(target=import_target, catch_all=True),
    serve_note="# a custom script decides where it saves; adjust CKPT if needed",
)
