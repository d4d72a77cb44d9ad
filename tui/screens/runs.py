"""The runs list: every run in the registry, kept up to date from disk once a second.

Reading is incremental (`Registry`: a finished run's state.json is read once, the runs folder
listed only when it changes) and the table is diffed, so only rows whose text changed are
redrawn: an idle list of thousands of finished runs costs next to nothing (bench/tui_idle.py).

Keys: `/` filter (id, name, status; Esc clears), `s`/`S` sort column/direction (shown in the
column header), space marks, `C` compares the marked runs, enter opens the monitor. Keys that
change anything (new, clone, open, import, resume, delete) are `MUTATING`: hidden
under --readonly; clone, resume and delete are hidden too while the run under the cursor is
another user's (`foreign`: core/rundir/ownership.py). Screens other modules own are
imported lazily through `SCREENS`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.worker import get_current_worker
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from tunedeck.tui.widgets.footer import Footer
from tunedeck.core.api import Registry, RunInfo
from tunedeck.tui.format import RUN_STATUS_STYLE, clean, fmt_age, fmt_duration, fmt_loss, fmt_rate
from tunedeck.tui.runfacts import RunFacts, read_facts
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.prompt import PromptScreen
from tunedeck.tui.widgets.titlebar import TitleBar

# (key, header); the header keeps a slot for the sort arrow so its width never changes. Marks
# get a column of their own, not row labels: DataTable measures labels only if no frame was
# drawn between add_row and its next idle, which a message handler cannot promise.
COLUMNS = [
    ("mark", ""),
    ("run", "RUN"),
    ("name", "NAME"),
    ("backend", "BACKEND"),
    ("model", "MODEL"),
    ("ranks", "RANKS"),
    ("status", "STATUS"),
    ("step", "STEP"),
    ("loss", "LOSS"),
    ("toks", "TOK/S"),
    ("time", "TIME"),
    ("age", "AGE"),
]
# the columns a narrow terminal leaves out, by the width (cells) each needs to be shown: the
# least telling go first, so every cell shown is whole
SHOWN_FROM = {"ranks": 110, "time": 120, "toks": 130, "model": 150, "backend": 170}
MARK = "●"
UP, DOWN = "▲", "▼"

# Ascending = the column's shown value grows down the list (AGE ▲: newest first).
SORT_KEYS: dict[str, Callable[[RunInfo], Any]] = {
    "age": lambda r: -r.created,
    "run": lambda r: r.run_id,
    "name": lambda r: r.name.lower(),
    "status": lambda r: r.status,
    "step": lambda r: r.step,
    "loss": lambda r: r.loss,
}
SORT_CYCLE = ["age", "run", "name", "status", "step", "loss"]


def _compose() -> type[Screen]:
    from tunedeck.tui.screens.compose import ComposeScreen

    return ComposeScreen


def _preflight() -> type[Screen]:
    from tunedeck.tui.screens.preflight import PreflightScreen

    return PreflightScreen


def _compare() -> type[Screen]:
    from tunedeck.tui.screens.compare import CompareScreen

    return CompareScreen


def _monitor() -> type[Screen]:
    from tunedeck.tui.screens.monitor import MonitorScreen

    return MonitorScreen


# Screens this one opens, imported when first needed (the app starts faster, and some are
# written in parallel). Tests swap entries to see what would be pushed with which arguments.
SCREENS: dict[str, Callable[[], type[Screen]]] = {
    "compose": _compose,
    "preflight": _preflight,
    "compare": _compare,
    "monitor": _monitor,
}


def filter_runs(runs: list[RunInfo], query: str) -> list[RunInfo]:
    """Runs whose id, name or status contain every word of the query (any case)."""
    terms = query.lower().split()
    if not terms:
        return runs
    return [r for r in runs if all(t in f"{r.run_id}\n{r.name}\n{r.status}".lower() for t in terms)]


def sort_runs(runs: list[RunInfo], column: str, descending: bool) -> list[RunInfo]:
    """Sorted by one column; ties keep the registry's order (newest first); a run without a
    value (no loss yet) goes last either way."""
    key = SORT_KEYS[column]
    have = [r for r in runs if key(r) is not None]
    return sorted(have, key=key, reverse=descending) + [r for r in runs if key(r) is None]


class RunsLoaded(Message):
    def __init__(self, runs: list[RunInfo], generation: int):
        super().__init__()
        self.runs = runs
        self.generation = generation


class FactsLoaded(Message):
    def __init__(self, facts: dict[str, RunFacts]):
        super().__init__()
        self.facts = facts


class Notice(Message):
    def __init__(self, text: str, severity: str = "information"):
        super().__init__()
        self.text = text
        self.severity = severity


class OpenScreen(Message):
    """A worker found what a screen needs; the UI thread pushes it."""

    def __init__(self, which: str, *args: Any, **kwargs: Any):
        super().__init__()
        self.which = which
        self.args = args
        self.kwargs = kwargs


class DeleteAsk(Message):
    def __init__(self, run: RunInfo, plan: Any):
        super().__init__()
        self.run = run
        self.plan = plan


class Deleted(Message):
    def __init__(self, run_id: str, result: Any, outputs: Path | None):
        super().__init__()
        self.run_id = run_id
        self.result = result
        self.outputs = outputs


class RunsScreen(TunedeckScreen):
    HELP = (
        "The runs under the registry root ($TUNEDECK_HOME/runs). Runs keep going when "
        "the TUI closes; open one to watch it live. Filter with /: every word must "
        "appear in the run's id, name or status. Deleting asks first, keeps the output "
        "folder (checkpoints) unless you confirm that folder by name, and never touches "
        "a run that is alive."
    )
    BINDINGS = [
        Binding("enter", "open", "Monitor"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse sort", show=False),
        Binding("space", "mark", "Mark", show=False),
        Binding("C", "compare", "Compare marked", show=False),
        Binding("n", "new_run", "New"),
        Binding("c", "clone", "Clone"),
        Binding("R", "resume", "Resume"),
        Binding("d", "delete", "Delete"),
        Binding("o", "open_spec", "Open spec file", show=False),
        Binding("i", "import_command", "Import command", show=False),
        Binding("escape", "clear", "Clear filter/marks", show=False),
        Binding("r", "reload", "Refresh", show=False),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "top", "Top", show=False),
        Binding("G", "bottom", "Bottom", show=False),
    ]
    AUTO_FOCUS = "#runs-table"  # not the filter box, hidden until /
    MUTATING = frozenset({"new_run", "clone", "open_spec", "import_command", "resume", "delete"})
    # keys that act on the run under the cursor: hidden while it is another user's (foreign:
    # shown read-only, never cloned, resumed or deleted from here)
    RUN_ACTIONS = frozenset({"clone", "resume", "delete"})
    # the detail has a fixed height, room for its three lines (settings, why, output): the list
    # keeps its size as the cursor moves between runs with more or fewer of them
    DEFAULT_CSS = """
    RunsScreen #runs-header { height: 1; padding: 0 1; color: $text-muted; }
    RunsScreen #runs-filter { display: none; height: 3; margin: 0 1; }
    RunsScreen #runs-filter.-shown { display: block; }
    RunsScreen #runs-table { height: 1fr; }
    RunsScreen #runs-empty { padding: 1 2; color: $text-muted; }
    RunsScreen #runs-detail { height: 4; padding: 0 1;
                              border-top: solid $panel; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._wake = threading.Event()  # set: scan now (r, a delete, leaving)
        self._stop = threading.Event()
        self.registry: Registry | None = None
        self.runs: list[RunInfo] = []  # every run, newest first (the registry's order)
        self.generation = -1
        self.filter_text = ""
        self.sort_column = "age"
        self.sort_descending = False
        self.marked: set[str] = set()
        self._view: list[RunInfo] = []
        self._view_key: tuple = ()
        self._shown: dict[str, tuple] = {}  # run id -> the cells on screen
        self._order: list[str] = []  # run ids in table order
        self._static: dict[str, tuple[RunInfo, tuple]] = {}
        self._painted_widths: tuple[int, ...] = ()
        self._ages_valid_until = 0.0  # clock time when an AGE on screen next changes
        self._full_scan = False  # next scan stats every run (r, after a delete)
        self.facts: dict[str, RunFacts] = {}  # run id -> its settings (read once, in the worker)
        self.shown_columns: list[str] = []

    # -- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        ro = getattr(self.app, "readonly", False)
        yield TitleBar("runs · read-only" if ro else "runs")
        with Vertical():
            yield Static("", id="runs-header")
            yield Input(
                placeholder="filter: words in id, name or status (esc clears)", id="runs-filter"
            )
            yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
            yield Static(
                "No runs yet. Press n to compose one (from a preset or blank), or "
                "run `tunedeck launch presets/demo.toml`.",
                id="runs-empty",
            )
            yield Static("", id="runs-detail", markup=False)
        yield Footer(compact=True)

    def _label(self, key: str, label: str) -> Text:
        if not label:
            return Text(" ")
        arrow = (DOWN if self.sort_descending else UP) if key == self.sort_column else " "
        return Text(f"{label} {arrow}")

    def _columns_for(self, width: int) -> list[str]:
        return [k for k, _ in COLUMNS if width >= SHOWN_FROM.get(k, 0)]

    def _set_columns(self, width: int) -> None:
        """The columns this width shows; a change rebuilds the table (its rows come back at
        the next redraw), so no cell is ever cut to make room."""
        keys = self._columns_for(width)
        if keys == self.shown_columns:
            return
        self.shown_columns = keys
        table = self.query_one("#runs-table", DataTable)
        table.clear(columns=True)
        labels = dict(COLUMNS)
        for key in keys:
            table.add_column(self._label(key, labels[key]), key=key)
        self._shown, self._order, self._painted_widths = {}, [], ()

    def on_resize(self, event) -> None:
        if self.shown_columns and self._columns_for(self.size.width) != self.shown_columns:
            self._rebuild(lambda: self._set_columns(self.size.width))

    def _rebuild(self, change: Callable[[], None]) -> None:
        """Redraw every row from scratch after `change`, keeping the run under the cursor."""
        selected = self.selected_run_id()
        change()
        self.redraw()
        if selected in self._order:
            table = self.query_one("#runs-table", DataTable)
            table.move_cursor(row=self._order.index(selected), animate=False)

    def _clear_rows(self) -> None:
        self.query_one("#runs-table", DataTable).clear()
        self._shown, self._order, self._painted_widths = {}, [], ()

    def on_mount(self) -> None:
        self._set_columns(self.app.size.width)
        self.query_one("#runs-empty").display = False
        self.registry = Registry()
        self.watch_registry()

    def on_screen_resume(self) -> None:
        # back from a monitor (a run just stopped there): scan now, not at the next tick
        self.load_runs()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    def now(self) -> float:
        return getattr(self.app, "clock", time.time)()

    # -- data (thread) ------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="runs-list", exit_on_error=False)
    def watch_registry(self) -> None:
        """One thread for the screen's life: scan, post only what the list needs, sleep. (A
        worker per tick cost more than the scan itself: each one posts its state changes to
        the UI thread.)"""
        reg = self.registry
        assert reg is not None
        worker = get_current_worker()
        posted = -1
        known: dict[str, RunFacts] = {}
        while not (self._stop.is_set() or worker.is_cancelled):
            self._wake.clear()
            full, self._full_scan = self._full_scan, False
            try:
                runs = reg.scan(full=full)
            except Exception as e:  # keep watching: one bad folder must not freeze the list
                if posted != -2:
                    self.post_message(Notice(f"reading the runs failed: {e}", "error"))
                posted = -2
                self._wake.wait(self.app.refresh_s)
                continue
            if reg.generation != posted or self.now() >= self._ages_valid_until:
                posted = reg.generation
                self.post_message(RunsLoaded(runs, reg.generation))
                # each run's settings once (spec.toml and plan.json are frozen at launch),
                # after the list is shown: 2,000 runs never wait for them
                new = {r.run_id: read_facts(r.run_dir) for r in runs if r.run_id not in known}
                if new:
                    known.update(new)
                    self.post_message(FactsLoaded(new))
            self._wake.wait(self.app.refresh_s)

    def load_runs(self, full: bool = False) -> None:
        """Scan now instead of at the next tick."""
        self._full_scan |= full
        self._wake.set()

    # -- view (UI thread) ---------------------------------------------------------------
    @on(RunsLoaded)
    def show_runs(self, msg: RunsLoaded) -> None:
        if msg.generation != self.generation:
            self.runs, self.generation = msg.runs, msg.generation
            ids = {r.run_id for r in msg.runs}
            self.marked &= ids
            self._static = {k: v for k, v in self._static.items() if k in ids}
        self.redraw()
        self.refresh_bindings()  # the run under the cursor may have become foreign

    @on(FactsLoaded)
    def _facts_loaded(self, msg: FactsLoaded) -> None:
        self.facts.update(msg.facts)
        if len(msg.facts) > 50:
            # many rows at once (the first read of a big registry): adding them again is
            # linear, where re-measuring a column per updated cell is quadratic (77 s of
            # the UI thread for 1,700 runs)
            self._rebuild(self._clear_rows)
        else:
            self.redraw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if super().check_action(action, parameters) is False:
            return False
        if action in self.RUN_ACTIONS:
            try:
                run = self.selected_run()
            except Exception:  # before the table exists
                return True
            if run is not None and run.foreign:
                return False
        return True

    @on(DataTable.RowHighlighted)
    def _cursor_moved(self, _event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()
        self._show_detail()

    def _show_detail(self) -> None:
        """The selected run in full: its settings, why it is in its state, its output."""
        run = self.selected_run()
        box = self.query_one("#runs-detail", Static)
        box.display = run is not None
        if run is None:
            return
        facts = self.facts.get(run.run_id, RunFacts())
        head = " · ".join(x for x in (clean(run.name or run.run_id), facts.line()) if x)
        lines = [head]
        if run.message:
            lines.append(f"{clean(run.status)}: {clean(run.message)}")
        if facts.output:
            out = Path(facts.output)
            where = (
                f"{out.relative_to(run.run_dir)}/ in the run's folder"
                if out.is_relative_to(run.run_dir)
                else str(out)
            )
            lines.append(f"output {clean(where)}")
        text = "\n".join(lines)
        if str(box.content) != text:
            box.update(text)

    def view(self) -> list[RunInfo]:
        """The runs on screen, in screen order (filtered and sorted)."""
        key = (self.generation, self.filter_text, self.sort_column, self.sort_descending)
        if key != self._view_key:
            self._view = sort_runs(
                filter_runs(self.runs, self.filter_text), self.sort_column, self.sort_descending
            )
            self._view_key = key
        return self._view

    def _cells(self, r: RunInfo, now: float) -> dict[str, Any]:
        """Every column's cell for one run (the table shows those its width allows)."""
        facts = self.facts.get(r.run_id, RunFacts())
        cached = self._static.get(r.run_id)
        if cached is None or cached[0] is not r or cached[1] is not facts:
            style = RUN_STATUS_STYLE.get(r.status, "")
            # a damaged run has no name to show: what is wrong with it goes there
            name = (
                Text(clean(r.message.removeprefix("damaged: ")), style="red")
                if r.damaged
                else Text(clean(r.name))
            )
            status = Text(clean(r.status), style=style)
            if r.stale_s is not None:  # its agent has gone quiet: the numbers are old
                status = Text(f"{clean(r.status)} stale {fmt_age(r.stale_s)}", style="yellow")
            fixed = {
                "run": clean(r.run_id),
                "name": name,
                "backend": facts.backend,
                "model": clean(facts.model),
                "ranks": facts.ranks_text,
                "status": status,
                "step": f"{r.step}/{r.max_steps}",
                "loss": fmt_loss(r.loss),
                "toks": fmt_rate(r.tokens_per_s) if r.tokens_per_s else "-",
            }
            self._static[r.run_id] = cached = (r, facts, fixed)
        start = r.started or r.created
        end = r.ended or (now if r.active else None)
        return {
            "mark": MARK if r.run_id in self.marked else " ",
            **cached[2],
            "time": fmt_duration(end - start) if start and end else "-",
            "age": fmt_age(now - r.created),
        }

    @staticmethod
    def _age_stable_for(age_s: float) -> float:
        """Seconds until fmt_age's text for this age changes (its unit's next tick)."""
        s = max(0, int(age_s))
        unit = next((u for u in (86400, 3600, 60) if s >= u), 1)
        return unit - s % unit - (age_s - int(age_s) if age_s > 0 else 0)

    def redraw(self) -> None:
        """Bring the table to the view by changing only what differs."""
        table = self.query_one("#runs-table", DataTable)
        runs = self.view()
        now = self.now()
        selected = self.selected_run_id()
        cursor = table.cursor_row
        keys = self.shown_columns
        want = {r.run_id: tuple(map(self._cells(r, now).__getitem__, keys)) for r in runs}
        self._ages_valid_until = now + min(
            (self._age_stable_for(now - r.created) for r in runs), default=3600.0
        )
        gone = [k for k in self._shown if k not in want]
        for k in gone:
            table.remove_row(k)
            del self._shown[k]
        order = [k for k in self._order if k in want]
        added = changed = False
        for r in runs:
            cells = want[r.run_id]
            old = self._shown.get(r.run_id)
            if old is None:
                table.add_row(*cells, key=r.run_id)
                order.append(r.run_id)
                added = True
            elif old != cells:
                for col, a, b in zip(keys, old, cells):
                    if a != b:
                        table.update_cell(r.run_id, col, b, update_width=True)
                        changed = True
            self._shown[r.run_id] = cells
        ids = [r.run_id for r in runs]
        moved = order != ids
        if moved:
            rank = {k: i for i, k in enumerate(ids)}
            table.sort("run", key=rank.__getitem__)
        self._order = ids
        if gone or moved:  # rows shifted under the cursor: keep it on the same run
            if selected in want:
                table.move_cursor(row=ids.index(selected), animate=False)
            elif ids:
                table.move_cursor(row=min(cursor, len(ids) - 1), animate=False)
        self.query_one("#runs-empty").display = not self.runs
        table.display = bool(self.runs)
        self._update_header(len(runs))
        self._show_detail()
        if added or gone or changed:  # the table measures new cells when idle: look again
            for delay in (0.05, 0.3, 1.0, 3.0):
                self.set_timer(delay, self._repaint_if_widths_changed)
        self._repaint_if_widths_changed()

    def _repaint_if_widths_changed(self) -> None:
        """The table measures new cells when it is next idle, but keeps the lines it drew
        before that, at the old widths (textual#4470): ids cut to the header's width until
        something else changed. Redraw once the widths moved."""
        table = self.query_one("#runs-table", DataTable)
        widths = tuple(c.get_render_width(table) for c in table.columns.values())
        if widths != self._painted_widths:
            self._painted_widths = widths
            if table.row_count:  # a same-value update is the public way to drop the cache
                table.update_cell_at((0, 0), table.get_cell_at((0, 0)))

    def _update_header(self, shown: int) -> None:
        arrow = DOWN if self.sort_descending else UP
        label = dict(COLUMNS)[self.sort_column]
        parts = [
            f"{shown} of {len(self.runs)} runs" if self.filter_text else f"{len(self.runs)} runs",
            f"sort {label} {arrow}",
        ]
        if self.filter_text:
            parts.append(f"filter “{self.filter_text}”")
        if self.marked:
            parts.append(f"{len(self.marked)} marked (C compares)")
        self.query_one("#runs-header", Static).update(Text("  ·  ".join(parts)))

    def _relabel(self) -> None:
        table = self.query_one("#runs-table", DataTable)
        for key, label in COLUMNS:
            if key in table.columns:
                table.columns[key].label = self._label(key, label)  # type: ignore[index]
        self._order = []  # force the sort below, which also redraws the header
        self.redraw()

    # -- selection ----------------------------------------------------------------------
    def selected_run_id(self) -> str | None:
        """The run under the cursor, read from the table itself (what the user sees)."""
        table = self.query_one("#runs-table", DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)

    def selected_run(self) -> RunInfo | None:
        run_id = self.selected_run_id()
        return next((r for r in self.runs if r.run_id == run_id), None)

    def say(self, text: str, severity: str = "information") -> None:
        self.notify(
            text,
            severity=severity,
            markup=False,  # type: ignore[arg-type]
            timeout=8 if severity != "information" else 4,
        )

    @on(Notice)
    def _notice(self, msg: Notice) -> None:
        self.say(msg.text, msg.severity)

    @on(OpenScreen)
    def _open_screen(self, msg: OpenScreen) -> None:
        self.push_lazy(msg.which, *msg.args, **msg.kwargs)

    def push_lazy(self, which: str, *args: Any, **kwargs: Any) -> None:
        try:
            cls = SCREENS[which]()
        except ImportError as e:
            if not (e.name or "").startswith("tunedeck.tui.screens."):
                raise
            self.say(f"the {which} screen is not in this build ({e})", "error")
            return
        try:
            screen = cls(*args, **kwargs)
        except TypeError as e:  # a screen written in parallel that takes other arguments
            self.say(f"cannot open the {which} screen: {e}", "error")
            return
        self.app.push_screen(screen)

    # -- navigation and view keys ---------------------------------------------------------
    def action_open(self) -> None:
        run_id = self.selected_run_id()
        if run_id:
            self.push_lazy("monitor", run_id)

    @on(DataTable.RowSelected)
    def row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()

    @on(DataTable.HeaderSelected)
    def header_selected(self, event: DataTable.HeaderSelected) -> None:
        col = str(event.column_key.value)
        if col not in SORT_KEYS:
            return
        if col == self.sort_column:
            self.sort_descending = not self.sort_descending
        else:
            self.sort_column, self.sort_descending = col, False
        self._relabel()

    def action_sort(self) -> None:
        i = SORT_CYCLE.index(self.sort_column)
        self.sort_column = SORT_CYCLE[(i + 1) % len(SORT_CYCLE)]
        self.sort_descending = False
        self._relabel()

    def action_reverse_sort(self) -> None:
        self.sort_descending = not self.sort_descending
        self._relabel()

    def action_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.add_class("-shown")
        box.focus()

    @on(Input.Changed, "#runs-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.redraw()

    @on(Input.Submitted, "#runs-filter")
    def filter_done(self, _event: Input.Submitted) -> None:
        if not self.filter_text:
            self.query_one("#runs-filter", Input).remove_class("-shown")
        self.query_one("#runs-table", DataTable).focus()

    def action_clear(self) -> None:
        box = self.query_one("#runs-filter", Input)
        if self.filter_text or box.has_class("-shown"):
            box.value = ""  # Input.Changed redraws
            self.filter_text = ""
            box.remove_class("-shown")
            self.query_one("#runs-table", DataTable).focus()
            self.redraw()
        elif self.marked:
            self.marked.clear()
            self.redraw()

    def action_mark(self) -> None:
        run_id = self.selected_run_id()
        if run_id is None:
            return
        self.marked ^= {run_id}
        self.redraw()

    def action_compare(self) -> None:
        ids = [r.run_id for r in self.runs if r.run_id in self.marked]
        if len(ids) < 2:
            self.say("mark two or more runs with space, then press C to compare them", "warning")
            return
        self.push_lazy("compare", ids)

    def action_reload(self) -> None:
        self.load_runs(full=True)

    def action_cursor_down(self) -> None:
        self.query_one("#runs-table", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#runs-table", DataTable).action_cursor_up()

    def action_top(self) -> None:
        self.query_one("#runs-table", DataTable).move_cursor(row=0)

    def action_bottom(self) -> None:
        t = self.query_one("#runs-table", DataTable)
        t.move_cursor(row=max(t.row_count - 1, 0))

    # -- keys that change things (hidden under --readonly) ----------------------------------
    def action_new_run(self) -> None:
        self.push_lazy("compose")

    def action_clone(self) -> None:
        run = self.selected_run()
        if run is not None:
            self._clone(run)

    def _made(self, make: Callable[[RunInfo], Any], run: RunInfo, failed: str = "") -> Any:
        """`make(run)` (a clone or resume spec; from a worker) with its notes said as
        warnings, or None once the error is said. `make` judges the run as it is on disk now,
        not as this list last read it."""
        from tunedeck.core.api import ManageError

        try:
            made = make(run)
        except ManageError as e:
            self.post_message(Notice(f"{failed}{e}", "error"))
            return None
        except Exception as e:  # noqa: BLE001 - a worker's error is otherwise silent
            self.post_message(Notice(f"{failed}{type(e).__name__}: {e}", "error"))
            return None
        for note in made.notes:
            self.post_message(Notice(note, "warning"))
        return made

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _clone(self, run: RunInfo) -> None:
        from tunedeck.core.api import clone_spec

        made = self._made(clone_spec, run, "cannot clone: ")
        if made is not None:
            self.post_message(OpenScreen("compose", spec=made.spec, title=f"clone of {run.run_id}"))

    def action_resume(self) -> None:
        run = self.selected_run()
        if run is not None:
            self._resume(run)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _resume(self, run: RunInfo) -> None:
        from tunedeck.core.api import resume_spec

        made = self._made(resume_spec, run, "cannot resume: ")
        if made is not None:
            self.post_message(
                Notice(f"resuming {clean(run.run_id)} from {clean(made.checkpoint.path.name)}")
            )
            self.post_message(OpenScreen("preflight", made.spec, gate=True))

    def action_open_spec(self) -> None:
        def answered(path: str | None) -> None:
            if path:
                self._open_spec(path)

        self.app.push_screen(
            PromptScreen("Open a spec file (TOML):", placeholder="path/to/spec.toml"), answered
        )

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _open_spec(self, text: str) -> None:
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            self.post_message(Notice(f"no such file: {path}", "error"))
            return
        self.post_message(OpenScreen("compose", path=path))

    def action_import_command(self) -> None:
        def answered(command: str | None) -> None:
            if command:
                self._import(command)

        self.app.push_screen(
            PromptScreen(
                "Paste an ms-swift or torchrun launch command (it is read, never run):",
                placeholder="NPROC_PER_NODE=2 swift sft --model ... --dataset ...",
                multiline_paste=True,
            ),
            answered,
        )

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _import(self, command: str) -> None:
        from tunedeck.core.api import CommandImportError, import_command

        try:
            imported = import_command(command)
            spec = imported.spec()
        except (CommandImportError, ValueError, RuntimeError) as e:
            # ValueError covers SpecError; RuntimeError an unreadable ms-swift flag table
            self.post_message(Notice(f"import failed: {e}", "error"))
            return
        for w in imported.warnings:
            self.post_message(Notice(f"import: {w}", "warning"))
        for n in imported.notes:  # how the command was read, where it differs from a guess
            self.post_message(Notice(f"import: {n}", "information"))
        self.post_message(OpenScreen("compose", spec=spec, title="imported command"))

    def action_delete(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        # judged by plan_delete on the run's state.json now, not on the list's last scan: a run
        # stopped a moment ago is not refused as running
        self._plan_delete(run)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _plan_delete(self, run: RunInfo) -> None:
        from tunedeck.core.api import ManageError, plan_delete

        try:
            plan = plan_delete(run, self.registry.root if self.registry else None)
        except ManageError as e:  # alive: stop it first
            self.post_message(Notice(f"not deleted: {e}", "warning"))
            return
        except OSError as e:
            self.post_message(Notice(f"not deleted: {e}", "error"))
            return
        self.post_message(DeleteAsk(run, plan))

    @on(DeleteAsk)
    def ask_delete(self, msg: DeleteAsk) -> None:
        run, plan = msg.run, msg.plan
        q = (
            f"Delete run {clean(run.run_id)} ({clean(run.name)}, "
            f"{clean(plan.status or run.status)})?\n\n"
            f"This removes its records: spec, plan, state, logs, events and metrics "
            f"({len(plan.records)} entries)."
        )
        if plan.output_dir is not None:
            if plan.outputs_deletable:
                q += (
                    f"\n\nIts output folder (checkpoints) is kept unless you confirm it "
                    f"next:\n{plan.output_dir}"
                )
            else:
                q += (
                    f"\n\nIts output folder stays ({plan.outputs_kept_because}):\n{plan.output_dir}"
                )

        def first(yes: bool | None) -> None:
            if not yes:
                self.say("nothing deleted")
            elif plan.outputs_deletable:
                self.app.push_screen(
                    ConfirmScreen(
                        f"Also delete the output folder\n\n{plan.output_dir}\n\nwith "
                        f"{plan.checkpoints} complete checkpoint(s) and everything else in it? "
                        f"This cannot be undone.\n\nD deletes the folder; n keeps it (the "
                        f"records go either way).",
                        yes_key="D",
                        yes_label="Delete folder",
                    ),
                    second,
                )
            else:
                self._delete(run, None)

        def second(yes: bool | None) -> None:
            self._delete(run, plan.output_dir if yes else None)

        self.app.push_screen(ConfirmScreen(q), first)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def _delete(self, run: RunInfo, outputs: Path | None) -> None:
        from tunedeck.core.api import ManageError, delete_run

        try:
            result = delete_run(
                run, outputs=outputs, root=self.registry.root if self.registry else None
            )
        except (ManageError, OSError) as e:
            self.post_message(Notice(f"not deleted: {e}", "error"))
            return
        self.post_message(Deleted(run.run_id, result, outputs))

    @on(Deleted)
    def deleted(self, msg: Deleted) -> None:
        self.marked.discard(msg.run_id)
        kept = msg.result.kept
        self.say(
            f"deleted {clean(msg.run_id)}'s records"
            + (f" and its output folder {msg.outputs}" if msg.outputs else "")
            + (f"; its outputs stay in {kept}" if kept else "")
        )
        self.action_reload()  # a kept output folder keeps the run's folder: look now
