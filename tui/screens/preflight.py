"""The preflight checklist, live, and the launch gate.

A thread worker runs the checks and posts each result as it comes; failures sort to the top,
each with its fix, and the highlighted check's detail and fix sit *below* the list (80×24
shows them). With `gate=True` this screen is the only way a TUI launch starts: `l` launches
only when no check failed, or after `O` overrode the failures (the run's state.json keeps
what was overridden and when, core/preflight gate_record). A fix that is a value (a free
port, fewer dataloader workers, ...) is applied to the spec being launched with `f`, and the
checks run again.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Static

from tunedeck.tui.widgets.footer import Footer
from tunedeck.core.api import pin_port
from tunedeck.core.spec import RunSpec, SpecError, set_values
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.widgets.titlebar import TitleBar

STATUS_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red", "skip": "dim"}


def fmt_value(v: Any) -> str:
    """A spec value as TOML writes it (for `f applies: key = value`)."""
    if v is None:
        return "(removed)"
    if isinstance(v, bool):
        return str(v).lower()
    return f'"{v}"' if isinstance(v, str) else str(v)


class CheckDone(Message):
    def __init__(self, generation: int, result) -> None:
        super().__init__()
        self.generation = generation
        self.result = result


class ChecksFinished(Message):
    def __init__(self, generation: int, error: str = "") -> None:
        super().__init__()
        self.generation = generation
        self.error = error


class Launched(Message):
    def __init__(self, run_id: str | None, error: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.error = error


class PreflightScreen(TunedeckScreen):
    HELP = (
        "Every check that would make the run fail in its first minutes; failures first. "
        "The highlighted check's detail and fix are below the list. f applies a fix "
        "that is a value to the spec being launched. A failure blocks the launch; O "
        "overrides it, and the run records what was overridden and when."
    )
    MUTATING = frozenset({"launch", "override"})
    BINDINGS = [
        Binding("l", "launch", "Launch"),
        Binding("f", "apply_fix", "Apply fix"),
        Binding("O", "override", "Override", key_display="O"),
        Binding("r", "rerun", "Re-run"),
        Binding("escape", "back", "Back"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]
    DEFAULT_CSS = """
    PreflightScreen #preflight-title { height: 1; padding: 0 1; background: $boost; }
    PreflightScreen #checks { height: 1fr; min-height: 4; }
    PreflightScreen #check-detail-box {
        height: 9; border-top: solid $panel; padding: 0 1;
    }
    PreflightScreen #gate-status { height: 1; padding: 0 1; background: $boost; }
    """
    # where GPU facts come from (None: NVML); tests put recorded facts here
    gpu_probe: Callable | None = None

    def __init__(self, spec: RunSpec, spec_path: Path | None = None, gate: bool = True) -> None:
        super().__init__()
        self.spec = pin_port(spec)
        self.spec_path = Path(spec_path) if spec_path else None
        self.gate = gate
        self.results: dict[str, Any] = {}
        self.generation = 0
        self.finished = False
        self.error = ""
        self.overridden: set[str] = set()  # failed check ids launched over, by O
        self.overridden_at: float | None = None
        self.applied: dict[str, Any] = {}  # fix values applied here, by f
        self.launching = False
        self.run_id: str | None = None
        # the compose screen sets this: hand the run id (or the applied fixes, on Esc) back
        # through dismiss instead of opening the monitor here
        self.dismiss_on_launch = False

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TitleBar("preflight")
        yield Static("", id="preflight-title", markup=False)
        yield DataTable(id="checks", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="check-detail-box"):
            yield Static("", id="check-detail")
        yield Static("", id="gate-status")
        yield Footer()

    def on_mount(self) -> None:
        t = self.query_one("#checks", DataTable)
        # fixed widths: rows are re-added in order as results come, and auto widths lag
        t.add_column("status", key="status", width=6)
        t.add_column("fix", key="fix", width=3)
        t.add_column("check", key="title", width=58)
        t.add_column("detail", key="detail", width=100)  # wide terminals: the first line
        self.action_rerun()

    # -- state ----------------------------------------------------------------------------
    def failed(self) -> list:
        return [r for r in self.results.values() if r.status == "fail"]

    def blocking(self) -> list:
        """Failures not overridden: each blocks the launch."""
        return [r for r in self.failed() if r.id not in self.overridden]

    def can_launch(self) -> bool:
        return (
            self.gate
            and self.finished
            and not self.error
            and not self.launching
            and not self.blocking()
        )

    def current(self):
        t = self.query_one("#checks", DataTable)
        if t.row_count == 0:
            return None
        key = t.coordinate_to_cell_key((t.cursor_row, 0)).row_key.value
        return self.results.get(key)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if super().check_action(action, parameters) is False:
            return False
        if action in ("launch", "override") and not self.gate:
            return False
        if action == "launch":
            return True if self.can_launch() else None
        if action == "override":
            return True if self.finished and self.blocking() else None
        if action == "apply_fix":
            try:
                r = self.current()
            except NoMatches:  # asked before the table exists
                r = None
            return True if r is not None and r.fix_set and r.status in ("fail", "warn") else None
        return True

    def _changed(self) -> None:
        self._show_gate()
        self.refresh_bindings()

    # -- checks (thread) --------------------------------------------------------------------
    def action_rerun(self) -> None:
        self.generation += 1
        self.results.clear()
        self.finished = False
        self.error = ""
        self.query_one("#checks", DataTable).clear()
        self.query_one("#check-detail", Static).update(Text("running checks…", style="dim"))
        self._title()
        self._changed()
        self._run(self.generation, copy.deepcopy(self.spec))

    @work(thread=True, exclusive=True, group="preflight", exit_on_error=False)
    def _run(self, generation: int, spec: RunSpec) -> None:
        from tunedeck.core.api import make_context, run_checks
        from tunedeck.core.spec import load_spec

        base = None
        if self.spec_path is not None:
            try:  # the file as written: the batch check compares against it
                base = load_spec(self.spec_path)
            except SpecError:
                base = None
        try:
            ctx = make_context(spec=spec, base=base, gpu_probe=type(self).gpu_probe)
            for r in run_checks(ctx):
                self.post_message(CheckDone(generation, r))
        except Exception as e:  # noqa: BLE001 - shown; the gate stays shut
            self.post_message(ChecksFinished(generation, f"{type(e).__name__}: {e}"))
            return
        self.post_message(ChecksFinished(generation))

    @on(CheckDone)
    def _add(self, msg: CheckDone) -> None:
        if msg.generation != self.generation:
            return  # a result from a run that `r` or a fix replaced
        self.results[msg.result.id] = msg.result
        self._fill()

    def _fill(self) -> None:
        from tunedeck.core.api import ordered

        t = self.query_one("#checks", DataTable)
        keep = self.current()
        t.clear()
        rows = ordered(list(self.results.values()))
        for r in rows:
            t.add_row(
                Text(r.status, style=STATUS_STYLE[r.status]),
                Text("f" if r.fix_set and r.status in ("fail", "warn") else "", style="bold"),
                Text(r.title),
                Text((r.detail.splitlines() or [""])[0][:100], style="dim"),
                key=r.id,
            )
        ids = [r.id for r in rows]
        if keep is not None and keep.id in ids:
            t.move_cursor(row=ids.index(keep.id))
        self._show()

    @on(ChecksFinished)
    def _done(self, msg: ChecksFinished) -> None:
        if msg.generation != self.generation:
            return
        self.finished = True
        self.error = msg.error
        if msg.error:
            self.query_one("#check-detail", Static).update(Text(msg.error, style="bold red"))
        else:
            self.query_one("#checks", DataTable).move_cursor(row=0)  # the first failure
            self._show()
        self._title()
        self._changed()

    # -- display ----------------------------------------------------------------------------
    def _title(self) -> None:
        from tunedeck.core.api import summary, summary_line

        where = f" ({self.spec_path.name})" if self.spec_path else ""
        text = f"Preflight: {self.spec.name}{where}"
        if self.finished and not self.error:
            self.sub_title = summary_line(summary(list(self.results.values())))
            text += f"  ·  {self.sub_title}"
        self.query_one("#preflight-title", Static).update(text)

    @on(DataTable.RowHighlighted)
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        self._show()
        self.refresh_bindings()

    def _show(self) -> None:
        r = self.current()
        if r is None:
            return
        out = Text()
        out.append(f"{r.status.upper()}  ", style=STATUS_STYLE[r.status])
        out.append(r.title, style="bold")
        out.append(f"  ({r.id})\n", style="dim")
        out.append(r.detail)
        if r.fix and r.status in ("fail", "warn"):
            out.append("\nfix: ", style="bold")
            out.append(r.fix)
        if r.fix_set and r.status in ("fail", "warn"):
            out.append("\nf applies: ", style="bold cyan")
            out.append(", ".join(f"{k} = {fmt_value(v)}" for k, v in r.fix_set.items()))
        self.query_one("#check-detail", Static).update(out)

    def _show_gate(self) -> None:
        status = self.query_one("#gate-status", Static)
        n_fail = len(self.failed())
        if self.launching:
            status.update(Text("launching…", style="bold"))
        elif not self.finished:
            status.update(Text("checking…", style="dim"))
        elif self.error:
            status.update(Text("the checks could not run: nothing can launch", style="bold red"))
        elif not self.gate:
            status.update(
                Text(
                    f"{n_fail} failed" if n_fail else "no check failed",
                    style="bold red" if n_fail else "green",
                )
            )
        elif self.blocking():
            status.update(
                Text(
                    f"blocked: {len(self.blocking())} failed · f applies a value "
                    "fix · O overrides (recorded in the run)",
                    style="bold red",
                )
            )
        elif n_fail:
            status.update(
                Text(
                    f"override armed for {n_fail} failure(s): l launches anyway "
                    "(recorded in the run)",
                    style="bold yellow",
                )
            )
        else:
            status.update(Text(f"ready: l launches {self.spec.name}", style="bold green"))

    # -- actions ----------------------------------------------------------------------------
    def action_apply_fix(self) -> None:
        r = self.current()
        if r is None or not r.fix_set:
            return
        try:
            self.spec = set_values(self.spec, r.fix_set)
        except SpecError as e:
            self.notify(f"cannot apply the fix: {'; '.join(e.problems)}", severity="error")
            return
        self.applied.update(r.fix_set)
        self.notify(
            "applied "
            + ", ".join(f"{k} = {fmt_value(v)}" for k, v in r.fix_set.items())
            + "; checking again"
        )
        self.action_rerun()

    def action_override(self) -> None:
        if not self.gate or not self.finished or not self.blocking():
            return
        self.overridden |= {r.id for r in self.failed()}
        self.overridden_at = time.time()
        self._changed()

    def action_launch(self) -> None:
        if not self.can_launch():
            return
        from tunedeck.core.api import gate_record

        results = list(self.results.values())
        record = gate_record(
            results,
            by="tui",
            overridden=bool(self.overridden),
            overridden_at=self.overridden_at,
            applied=self.applied,
        )
        self.launching = True
        self._changed()
        self._launch(copy.deepcopy(self.spec), record)

    @work(thread=True, exclusive=True, group="preflight-launch", exit_on_error=False)
    def _launch(self, spec: RunSpec, record: dict) -> None:
        from tunedeck.core.api import launch

        try:
            run_dir = launch(spec, preflight=record)
        except Exception as e:  # noqa: BLE001 - the message is the user's to read
            self.post_message(Launched(None, str(e)))
            return
        self.post_message(Launched(run_dir.name))

    @on(Launched)
    def _launched(self, msg: Launched) -> None:
        if msg.run_id is None:
            self.launching = False
            self._changed()
            self.notify(f"launch failed: {msg.error}", severity="error", timeout=10)
            return
        self.run_id = msg.run_id
        self.notify(f"launched {msg.run_id}")
        if self.dismiss_on_launch:
            self.dismiss(msg.run_id)
            return
        from tunedeck.tui.screens.monitor import MonitorScreen

        # replace this screen in one step (the monitor's Esc goes back to what opened this)
        self.app.switch_screen(MonitorScreen(msg.run_id))

    def action_cursor_down(self) -> None:
        self.query_one("#checks", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#checks", DataTable).action_cursor_up()

    def action_back(self) -> None:
        if self.dismiss_on_launch:
            self.dismiss(dict(self.applied))  # the form takes the fixes applied here
        else:
            self.app.pop_screen()
