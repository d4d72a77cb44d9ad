"""The monitor: one run, live from its run directory, in panes (progress, loss, hardware,
findings, NCCL, logs). Tab moves between them, `m` maximises the focused one.

Every read happens in thread workers that post messages (the run's `RunWatcher` for the
panes, its `RankLog` for the log pane, windows and searches of the log in the log view's
own workers); the handlers on the UI thread only update widgets. The screen keeps one
watcher (one read-only run.db connection) for its life and closes it when it leaves.
"""

from __future__ import annotations

import threading
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.message import Message
from textual.widgets import OptionList, Static

from tunedeck.tui.widgets.footer import Footer
from tunedeck.core.api import LogState, RankLog, RunNotFound, RunWatcher, Snapshot, find_run
from tunedeck.core.rundir import TERMINAL
from tunedeck.tui.format import clean
from tunedeck.tui.runfacts import RunFacts, read_facts
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.widgets.findings import FindingScreen, FindingsList
from tunedeck.tui.widgets.hardware import HardwareView
from tunedeck.tui.widgets.logview import LogView, SearchInput
from tunedeck.tui.widgets.lossplot import LossPlot, RunSource
from tunedeck.tui.widgets.nccl import NcclView
from tunedeck.tui.widgets.panes import Pane, ScrollPane
from tunedeck.tui.widgets.progress import ProgressView
from tunedeck.tui.widgets.titlebar import TitleBar

LOG_SLICE_BYTES = 128 << 20  # index a big log in slices, showing each as it is done
WIDE = (120, 36)  # from this size on, the roomier layout
ROOMY = 150  # from this width on, the hardware pane gets the width of its bars


class SnapshotReady(Message):
    def __init__(self, snap: Snapshot):
        super().__init__()
        self.snap = snap


class LogUpdated(Message):
    def __init__(self, source: RankLog, state: LogState):
        super().__init__()
        self.source, self.state = source, state


class FactsRead(Message):
    def __init__(self, facts: RunFacts):
        super().__init__()
        self.facts = facts


class ParentFound(Message):
    def __init__(self, run_id: str, run_dir):
        super().__init__()
        self.run_id, self.run_dir = run_id, run_dir


def resumed_parent(run):
    """The run `run` resumed from: its spec's train.resume_from lies in the output folder of
    an older run (resume keeps the folder), the newest such run; None for a fresh run."""
    import tomllib
    from pathlib import Path

    from tunedeck.core.api import list_runs

    def spec(r) -> dict:
        try:
            return tomllib.loads((Path(r.run_dir) / "spec.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return {}

    own = spec(run)
    ckpt = (own.get("train") or {}).get("resume_from")
    if not ckpt:
        return None
    ckpt = Path(ckpt)
    for other in list_runs():  # newest first
        if other.run_id == run.run_id or other.created >= run.created:
            continue
        out = (spec(other).get("run") or {}).get("output_dir")
        out = Path(out).expanduser() if out else Path(other.run_dir) / "output"
        if ckpt.is_relative_to(out):
            return other
    return None


NODES_NAMED = 6  # a stop question names this many nodes, then counts the rest: with its
# note it fits the dialog at 80x24 (13 lines, 58 columns), buttons included
HOST_SHOWN = 22  # a longer host name is cut (with …) so that a node's line fits


def stop_question(run_id: str, hard: bool, nodes: list[dict]) -> str:
    """The stop dialog's question. A multi-node run's stop reaches every node (the head
    passes it on; under Slurm scancel), so the question names them: each node, its host and
    ranks, and whether its part has ended or is unreached (it gets the stop when its link
    returns)."""
    q = (
        f"Kill every process of {run_id} now (SIGKILL, no checkpoint)?"
        if hard
        else f"Stop {run_id}?\nRanks finish their step and write a checkpoint; anything "
        f"still alive after the grace period is killed."
    )
    if len(nodes) < 2:
        return q
    lines = []
    slurm = any(n.get("slurm") for n in nodes)
    later = False
    for n in nodes[:NODES_NAMED]:
        ranks = list(n.get("ranks") or [])
        rk = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        host = clean(str(n.get("host") or ""))  # Slurm's: known once it runs
        if len(host) > HOST_SHOWN:
            host = host[: HOST_SHOWN - 1] + "…"
        line = f"  node {n.get('node')}{' ' + host if host else ''}: {rk if ranks else '-'}"
        status, reach = n.get("status"), n.get("reach")
        if status in TERMINAL:
            line += f" (ended: {clean(str(status))})"
        elif reach in ("unreached", "reconnecting"):
            line += f" ({reach})"
            later = True
        elif reach == "lost":
            line += " (lost: agent gone)"
        elif reach == "not started by tunedeck" and not slurm:  # Slurm's scancel reaches it
            line += " (no link from the head)"
        lines.append(line)
    rest = nodes[NODES_NAMED:]
    if rest:
        first = (rest[0].get("ranks") or ["?"])[0]
        last = (rest[-1].get("ranks") or ["?"])[-1]
        lines.append(f"  and {len(rest)} more nodes (ranks {first}-{last})")
    if later:
        lines.append("An unreached node gets the stop when its link returns.")
    verb = "kills" if hard else "stops"
    return f"{q}\nThis {verb} the ranks on all {len(nodes)} nodes:\n" + "\n".join(lines)


class ActionDone(Message):
    def __init__(self, text: str, severity: str = "information"):
        super().__init__()
        self.text = text
        self.severity = severity


class MonitorScreen(TunedeckScreen):
    HELP = (
        "Live view of one run, read from its run directory; closing the TUI never "
        "touches the run. Tab moves between panes, m maximises one (Esc restores). "
        "Logs: a rank's stdout and stderr in the order they were seen to arrive (the "
        "files have no time stamps: lines already there when the view opened show as "
        "stdout, then stderr; a red mark is stderr); at the bottom the view follows, "
        "scrolling up pauses, G or End resumes. A graceful stop lets the ranks finish "
        "their step and checkpoint; after the grace period everything left is killed. "
        "A stalled run: d shows every rank's Python stack; the rank not inside a "
        "collective is the one the others wait for."
    )
    MUTATING = frozenset({"stop", "kill"})
    ALLOW_IN_MAXIMIZED_VIEW = "TitleBar, Footer"
    BINDINGS = [
        Binding("escape", "back", "Runs"),
        Binding("m", "maximize_pane", "Max"),
        Binding("right_square_bracket", "rank(1)", "Rank", key_display="[ ]"),
        Binding("left_square_bracket", "rank(-1)", "Previous rank", key_display="[", show=False),
        Binding("slash", "search", "Find", key_display="/"),
        Binding("n", "next_hit(1)", "Next match", show=False),
        Binding("N", "next_hit(-1)", "Previous match", show=False),
        Binding("e", "first_error", "Error"),
        Binding("G", "follow", "Follow log", show=False),
        Binding("v", "finding", "Finding details", show=False),
        Binding("s", "stop", "Stop"),
        Binding("K", "kill", "Kill"),
        Binding("d", "stacks", "Stacks"),
    ]
    # The chart and the GPUs get the area (as btop and nvitop give it): progress and findings
    # share a short top band, the chart and the hardware the middle, the log a band that
    # grows while it has focus. NCCL sits beside the log, and gives its place to the log on
    # a run without NCCL lines (gloo, CPU). At 80 columns the hardware is as wide as the chart.
    DEFAULT_CSS = """
    MonitorScreen TitleBar { dock: top; }
    MonitorScreen #panes {
        layout: grid; height: 1fr;
        grid-size: 2 4; grid-columns: 1fr 1fr; grid-rows: 5 2fr 1fr 2; grid-gutter: 0 1;
    }
    MonitorScreen #nccl-pane, MonitorScreen #log-pane { column-span: 2; }
    MonitorScreen.-log-focus #panes { grid-rows: 5 1fr 2fr 2; }
    MonitorScreen.-wide #panes {
        grid-size: 2 3; grid-columns: 3fr 2fr; grid-rows: 8 2fr 1fr;
    }
    MonitorScreen.-wide.-log-focus #panes { grid-rows: 8 1fr 2fr; }
    MonitorScreen.-roomy #panes { grid-columns: 1fr 74; }
    MonitorScreen.-wide #nccl-pane, MonitorScreen.-wide #log-pane { column-span: 1; }
    MonitorScreen.-no-nccl #nccl-pane { display: none; }
    MonitorScreen.-no-nccl #panes { grid-size: 2 3; grid-rows: 5 2fr 1fr; }
    MonitorScreen.-no-nccl.-log-focus #panes { grid-rows: 5 1fr 2fr; }
    MonitorScreen.-wide.-no-nccl #panes { grid-rows: 8 2fr 1fr; }
    MonitorScreen.-wide.-no-nccl.-log-focus #panes { grid-rows: 8 1fr 2fr; }
    MonitorScreen.-no-nccl #log-pane { column-span: 2; }
    MonitorScreen #loss-plot { height: 1fr; }
    MonitorScreen #log-status { height: 1; color: $text-muted; }
    MonitorScreen #log-search { height: 1; border: none; padding: 0; display: none; }
    MonitorScreen #log-search.-open { display: block; }
    MonitorScreen #findings-list { height: 1fr; }
    """

    def __init__(self, run_ref: str):
        super().__init__()
        self.run_ref = run_ref
        self.watcher: RunWatcher | None = None
        self.snap: Snapshot | None = None
        self.facts = RunFacts()  # the run's settings, for the title (read once)
        self.ranks: list[int] = [0]
        self.log_rank = 0
        self.show_s: list[float] = []  # UI-thread time of each refresh (bench)
        self._polling = threading.Lock()
        self._log_polling = threading.Lock()
        self._findings_seen = False
        self._closed = False
        self._read_error = ""

    def compose(self) -> ComposeResult:
        yield TitleBar(f"monitor · {self.run_ref}")
        with Container(id="panes"):
            with ScrollPane(id="progress-pane", title="progress"):
                yield ProgressView(id="monitor-stats")
            with Pane(id="findings-pane", title="findings"):
                yield FindingsList(id="findings-list")
            with Pane(id="loss-pane", title="loss"):
                # the whole run from run.db, zoomable; it queries in its own worker
                yield LossPlot(RunSource.for_run_id(self.run_ref), id="loss-plot")
            with ScrollPane(id="hw-pane", title="hardware"):
                yield HardwareView(id="gpu-panel")
            with Pane(id="log-pane", title="rank 0 log"):
                yield LogView(id="log-view")
                yield SearchInput(
                    placeholder="search the log (Enter; Esc to cancel)", id="log-search"
                )
                yield Static("reading…", id="log-status", markup=False)
            with ScrollPane(id="nccl-pane", title="NCCL"):
                yield NcclView(id="nccl-view")
        yield Footer()

    def on_mount(self) -> None:
        self._layout_for(self.size.width, self.size.height)
        self.query_one(LossPlot).focus()  # the chart's keys (cursor, zoom) work at once
        self.poll()
        self.set_interval(self.app.refresh_s, self.poll)
        self.set_interval(self.app.refresh_s, self.poll_log)

    def on_resize(self, event) -> None:
        self._layout_for(event.size.width, event.size.height)

    def _layout_for(self, width: int, height: int) -> None:
        self.set_class(width >= WIDE[0] and height >= WIDE[1], "-wide")
        # room for the GPU bars (the hardware pane's full form) beside a chart still wider
        self.set_class(width >= ROOMY, "-roomy")

    def on_descendant_focus(self, event) -> None:
        # the log band grows while it has focus, and gives the rows back after
        log = self.query_one("#log-pane")
        self.set_class(event.widget is log or log in event.widget.ancestors, "-log-focus")

    def on_unmount(self) -> None:
        # wait for a poll in flight: its SQLite connection must not close under it (seen:
        # a segfault in findings() as the app shut down)
        with self._polling:
            self._closed = True
            if self.watcher is not None:
                self.watcher.close()

    # -- data (threads) ---------------------------------------------------------------
    @work(thread=True, exclusive=True, group="monitor-poll", exit_on_error=False)
    def poll(self) -> None:
        # exclusive= cannot stop a thread already running: on a slow filesystem the ticks
        # would pile up polls of the same watcher; a tick that finds one running skips
        if not self._polling.acquire(blocking=False):
            return
        try:
            if not self._closed:
                self._poll()
        except Exception as e:  # noqa: BLE001 - a run's files the reader cannot take: say so
            # (once; the next tick tries again), never leave the screen on "reading…" for good
            text = f"cannot read this run: {e} (`tunedeck doctor {self.run_ref}` says more)"
            if text != self._read_error:
                self._read_error = text
                self.post_message(ActionDone(text, "error"))
        finally:
            self._polling.release()

    def _poll(self) -> None:
        if self.watcher is None:
            try:
                run = find_run(self.run_ref)
            except RunNotFound as e:
                self.post_message(ActionDone(str(e), "error"))
                return
            self.run_ref = run.run_id
            self.watcher = RunWatcher(run.run_dir, rank=self.log_rank)
            self.poll_log()
            self.post_message(FactsRead(read_facts(run.run_dir)))
            parent = resumed_parent(run)
            if parent is not None:
                self.post_message(ParentFound(parent.run_id, parent.run_dir))
            # the first frame without the whole-run strips (a week of telemetry takes a
            # few hundred ms to fold): they follow in the next snapshot
            self.post_message(SnapshotReady(self.watcher.poll(history=False)))
        self.post_message(SnapshotReady(self.watcher.poll()))

    @work(thread=True, exclusive=False, group="monitor-log", exit_on_error=False)
    def poll_log(self) -> None:
        """Index what the selected rank's log gained; a big log in slices, each shown as
        it is done (the view opens at once and fills in)."""
        if self.watcher is None or not self._log_polling.acquire(blocking=False):
            return
        try:
            log = self.watcher.log
            while True:
                state = log.update(max_bytes=LOG_SLICE_BYTES)
                self.post_message(LogUpdated(log, state))
                if log.caught_up or log.rank != self.watcher.log_rank:
                    break
        finally:
            self._log_polling.release()

    # -- view (UI thread) -------------------------------------------------------------
    @on(SnapshotReady)
    def show(self, msg: SnapshotReady) -> None:
        t0 = time.perf_counter()
        snap = self.snap = msg.snap
        run = snap.run
        if run is None:
            return
        self._show_title(run)
        self.query_one(ProgressView).show(snap)
        self._show_loss(snap)
        self.query_one(HardwareView).show(
            snap.telemetry, snap.history, run.state.get("host"), snap.nodes
        )
        self._show_findings(snap)
        self.query_one(NcclView).show(snap.nccl)
        # a run whose logs hold no NCCL line (gloo, CPU) gets no NCCL pane
        if snap.nccl is not None and all(r.caught_up for r in snap.nccl):
            self.set_class(not any(r.nccl_lines or r.issues for r in snap.nccl), "-no-nccl")
        self.ranks = snap.ranks or [0]
        self.show_s.append(time.perf_counter() - t0)

    def _show_loss(self, snap: Snapshot) -> None:
        """The chart re-queries its visible window (following the newest steps when the
        view is at the end); the query runs in the chart's own worker."""
        self.query_one(LossPlot).refresh_data()

    def _show_findings(self, snap: Snapshot) -> None:
        box = self.query_one(FindingsList)
        new = box.show(snap.findings)
        pane = self.query_one("#findings-pane")
        errors = sum(1 for f in snap.findings if f.get("severity") == "error")
        pane.border_title = (
            f"findings ({len(snap.findings)}, {errors} error{'s' if errors != 1 else ''})"
            if snap.findings
            else "findings"
        )
        if self._findings_seen:
            for f in new:  # as they appear: a toast besides the list
                sev = f.get("severity")
                self.notify(
                    f"{f.get('category')}: {f.get('summary')}",
                    title="new finding",
                    severity="error"
                    if sev == "error"
                    else "warning"
                    if sev == "warning"
                    else "information",
                )
        self._findings_seen = True

    def _show_title(self, run) -> None:
        # the settings before the id: a narrow terminal cuts the id, not what the run is
        parts = ("monitor", run.name, self.facts.line(), run.run_id)
        title = TitleBar._text(" · ".join(x for x in parts if x))
        bar = self.query_one(TitleBar)
        if str(bar.content) != title:
            bar.update(title, layout=False)

    @on(FactsRead)
    def _facts_read(self, msg: FactsRead) -> None:
        self.facts = msg.facts
        if self.snap is not None and self.snap.run is not None:
            self._show_title(self.snap.run)

    @on(ParentFound)
    def join_parent(self, msg: ParentFound) -> None:
        self.query_one(LossPlot).set_parent(msg.run_id, msg.run_dir)

    @on(LogUpdated)
    def show_log(self, msg: LogUpdated) -> None:
        if msg.state.rank != self.log_rank:
            return  # a poll of the rank shown before a switch
        self.query_one(LogView).set_state(msg.state, msg.source)

    @on(LogView.StatusChanged)
    def show_log_status(self, msg: LogView.StatusChanged) -> None:
        self.query_one("#log-status", Static).update(self.query_one(LogView).status(), layout=False)

    @property
    def loss_shown(self) -> float | None:
        """The loss the progress pane shows (tests compare it with the last event)."""
        if self.snap is not None:
            return self.snap.progress.loss
        return None

    # -- panes ------------------------------------------------------------------------
    def action_maximize_pane(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        w = self.focused
        while w is not None and not isinstance(w, (Pane, ScrollPane)):
            w = w.parent if w.parent is not self else None
        if w is not None:
            self.maximize(w, container=False)

    # -- logs -------------------------------------------------------------------------
    def action_rank(self, delta: int) -> None:
        ranks = self.ranks or [0]
        i = ranks.index(self.log_rank) if self.log_rank in ranks else 0
        self.log_rank = ranks[(i + delta) % len(ranks)]
        self.query_one("#log-pane").border_title = f"rank {self.log_rank} log"
        if self.watcher is not None:
            self.watcher.set_log_rank(self.log_rank)
            self.poll_log()

    def action_search(self) -> None:
        box = self.query_one(SearchInput)
        box.add_class("-open")
        box.focus()

    @on(SearchInput.Submitted)
    def search_submitted(self, msg: SearchInput.Submitted) -> None:
        box = self.query_one(SearchInput)
        box.remove_class("-open")
        view = self.query_one(LogView)
        view.focus()
        view.search(msg.value)

    @on(SearchInput.Cancelled)
    def search_cancelled(self) -> None:
        self.query_one(SearchInput).remove_class("-open")
        self.query_one(LogView).focus()

    def action_next_hit(self, step: int) -> None:
        self.query_one(LogView).next_hit(step)

    def action_first_error(self) -> None:
        self.query_one(LogView).first_error()

    def action_follow(self) -> None:
        self.query_one(LogView).action_follow()

    # -- findings ---------------------------------------------------------------------
    @on(OptionList.OptionSelected, "#findings-list")
    def finding_selected(self, msg: OptionList.OptionSelected) -> None:
        self.action_finding()

    def action_finding(self) -> None:
        box = self.query_one(FindingsList)
        f = box.current or (box.findings[0] if box.findings else None)
        if f is None:
            self.notify("no finding so far", severity="information")
            return
        self.app.push_screen(FindingScreen(f))

    # -- actions ----------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_stop(self) -> None:
        self._confirm_stop(hard=False)

    def action_kill(self) -> None:
        self._confirm_stop(hard=True)

    def _confirm_stop(self, hard: bool) -> None:
        if getattr(self.app, "readonly", False):
            self.notify("read-only session: stopping is disabled", severity="warning")
            return
        run = self.snap.run if self.snap else None
        if run is None or not run.needs_stop:
            self.notify("this run is not running", severity="warning")
            return
        q = stop_question(run.run_id, hard, self.snap.nodes if self.snap else [])

        def answered(yes: bool | None) -> None:
            if yes:
                self.request_stop(hard)

        self.app.push_screen(ConfirmScreen(q), answered)

    @work(thread=True, exclusive=True, group="monitor-stop", exit_on_error=False)
    def request_stop(self, hard: bool) -> None:
        from tunedeck.core.api import request_stop

        try:
            request_stop(find_run(self.run_ref), hard=hard)
        except Exception as e:  # shown to the user, never raised into the UI
            self.post_message(ActionDone(f"stop failed: {e}", "error"))
            return
        self.post_message(ActionDone("hard stop requested" if hard else "graceful stop requested"))

    def action_stacks(self) -> None:
        run = self.snap.run if self.snap else None
        if run is None or not run.needs_stop:
            self.notify("this run is not running: no stacks to dump", severity="warning")
            return
        self.notify("asking every rank for its stack...")
        self.dump_stacks(run.run_dir)

    @work(thread=True, exclusive=True, group="monitor-stacks", exit_on_error=False)
    def dump_stacks(self, run_dir) -> None:
        from tunedeck.core.api import dump_stacks

        try:
            dumps = dump_stacks(run_dir)
        except Exception as e:  # shown to the user, never raised into the UI
            self.post_message(ActionDone(f"stack dump failed: {e}", "error"))
            return
        self.app.call_from_thread(self._show_stacks, dumps)

    def _show_stacks(self, dumps: list) -> None:
        from tunedeck.tui.screens.stacks import StacksScreen

        self.app.push_screen(StacksScreen(dumps))

    @on(ActionDone)
    def action_done(self, msg: ActionDone) -> None:
        self.notify(msg.text, severity=msg.severity)
