"""One sink per tracker, each written through the tracker's own library (imported only when
configured): TensorBoard (the tensorboard package's own event file writer: the agent never
imports torch), W&B
(`wandb.init(mode="offline")` by default: a run folder `wandb sync` uploads later) and MLflow
(a file store in the run directory, or the user's tracking URI).

Every sink gets the masked spec as its config and launch.sh (masked) as its notes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import TRACKERS, RunSpec, mask_spec


class Sink(Protocol):
    name: str

    def log(self, step: int, values: dict[str, float]) -> None: ...
    def note(self, step: int, tag: str, text: str) -> None: ...
    def close(self, dropped: int) -> None: ...


def tracking_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "tracking"


def _notes(run_dir: Path) -> str:
    try:
        return RunDir(run_dir).launch_sh.read_text(errors="replace")[:20000]
    except OSError:
        return ""


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: Path, spec: RunSpec):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.w = EventFileWriter(str(tracking_dir(run_dir) / "tensorboard"))
        self.note(0, "spec", "```\n" + mask_spec(spec).to_toml() + "\n```")
        if notes := _notes(run_dir):
            self.note(0, "command", "```\n" + notes + "\n```")

    def _add(self, step: int, *values) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def log(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._add(step, *(Summary.Value(tag=t, simple_value=v) for t, v in values.items()))

    def note(self, step: int, tag: str, text: str) -> None:
        # the text plugin's form: a string tensor under `<tag>/text_summary`
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.metadata import create_summary_metadata

        meta = create_summary_metadata(display_name=tag, description="")
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self._add(step, Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor))

    def close(self, dropped: int) -> None:
        self.log(0, {"tracking/dropped_points": float(dropped)})
        self.w.close()


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, spec: RunSpec):
        import wandb

        out = tracking_dir(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=spec.tracking.wandb_project,
            name=spec.name,
            id=Path(run_dir).name,
            dir=str(out),
            mode=spec.tracking.wandb,
            config=mask_spec(spec).to_dict(),
            notes=_notes(run_dir),
            tags=[spec.backend, spec.method.type],
            # the rank's own stdout stays its own; GPU telemetry is tunedeck's (run.db)
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def note(self, step: int, tag: str, text: str) -> None:
        self.run.summary[tag] = text

    def close(self, dropped: int) -> None:
        import wandb

        self.run.summary["tracking/dropped_points"] = dropped
        self.run.finish()
        # finish returns before wandb's service has written the run file out; teardown waits
        # for the service to exit (the agent would otherwise kill it as a leftover, mid-write)
        try:
            wandb.teardown()
        except SystemExit as e:  # its way of reporting a service that failed
            raise RuntimeError(f"wandb's service exited with {e.code}") from None


class MlflowSink:
    name = "mlflow"

    def __init__(self, run_dir: Path, spec: RunSpec):
        from mlflow.tracking import MlflowClient

        uri = spec.tracking.mlflow_uri
        if not uri:  # a folder beside the run needs no server; MLflow 3 asks to allow it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (tracking_dir(run_dir) / "mlruns").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name("tunedeck")
        exp_id = exp.experiment_id if exp else self.client.create_experiment("tunedeck")
        run = self.client.create_run(
            exp_id,
            run_name=spec.name,
            tags={
                "tunedeck.run_id": Path(run_dir).name,
                "mlflow.note.content": _notes(run_dir),
            },
        )
        self.run_id = run.info.run_id
        self.client.log_text(self.run_id, mask_spec(spec).to_toml(), "spec.toml")

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, v, ms, step) for k, v in values.items()]
        )

    def note(self, step: int, tag: str, text: str) -> None:
        self.client.set_tag(self.run_id, tag, text)

    def close(self, dropped: int) -> None:
        self.client.set_tag(self.run_id, "tracking.dropped_points", str(dropped))
        self.client.set_terminated(self.run_id)


# --report_to a backend runs with when its arguments do not say: ms-swift's is tensorboard
# (its event files under output/v*/runs); an HF script's, transformers' own: none
_REPORT_DEFAULT = {"swift": ("tensorboard",)}


def _report_to(argv: list[str]) -> list[str] | None:
    """The values of the last --report_to in an argv (`--report_to a b`, `--report_to=a,b`),
    None when there is none."""
    found = None
    for i, a in enumerate(argv):
        if a == "--report_to":
            vals = []
            for v in argv[i + 1 :]:
                if v.startswith("--"):
                    break
                vals.append(v)
            found = vals
        elif a.startswith("--report_to="):
            found = [a.split("=", 1)[1]]
    if found is None:
        return None
    return [v.strip().lower() for x in found for v in x.split(",") if v.strip()]


def backend_reports(spec: RunSpec) -> set[str]:
    """The trackers the backend writes by itself: tracking.backend_reports, and what its own
    --report_to says (or its default) for ms-swift and a script."""
    named = set(spec.tracking.backend_reports)
    argv = {"swift": spec.swift.extra_args, "script": spec.script.args}.get(spec.backend)
    if argv is None:
        return named
    given = _report_to(list(argv))
    if given is None:
        given = list(_REPORT_DEFAULT.get(spec.backend, ()))
    if "all" in given:
        return named | set(TRACKERS)
    return named | (set(given) & set(TRACKERS))


def wanted(spec: RunSpec) -> list[str]:
    """The trackers the mirror writes: those the spec turns on, less the backend's own."""
    t = spec.tracking
    on = {"tensorboard": t.tensorboard, "wandb": t.wandb != "off", "mlflow": t.mlflow}
    own = backend_reports(spec)
    return [name for name, yes in on.items() if yes and name not in own]


def tensorboard_logdir(run_dir: Path, spec: RunSpec) -> Path:
    """Where a run's TensorBoard files are: the mirror's folder, or the backend's output
    folder when the backend writes them itself (TensorBoard finds them below it)."""
    if "tensorboard" in backend_reports(spec):
        return RunDir(run_dir).output_dir(spec)
    return tracking_dir(run_dir) / "tensorboard"


SINKS = {
    "tensorboard": (TensorBoardSink, "tensorboard"),
    "wandb": (WandbSink, "wandb"),
    "mlflow": (MlflowSink, "mlflow-skinny"),
}


def open_sinks(spec: RunSpec, run_dir: Path) -> tuple[list[Sink], list[str]]:
    """The sinks the spec asks for, and one line per tracker that could not start."""
    sinks, problems = [], []
    for name in wanted(spec):
        cls, package = SINKS[name]
        try:
            sinks.append(cls(run_dir, spec))
        except ImportError as e:
            problems.append(
                f"tracking.{name}: {e.name or package} is not installed "
                f"(pip install 'tunedeck[trackers]'); {name} is off for this run"
            )
        except Exception as e:  # noqa: BLE001 - a tracker never stops the run
            problems.append(f"tracking.{name} could not start ({type(e).__name__}: {e})")
    return sinks, problems
