"""The monitor: one run, live from its run directory (progress, loss curve, rank 0's log)."""

from __future__ import annotations

import threading

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Log, Sparkline, Static

from tunedeck.core.runs.registry import RunNotFound, find_run
from tunedeck.core.runs.watch import RunWatcher, Snapshot
from tunedeck.tui.format import fmt_duration, fmt_loss, fmt_rate
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.widgets.titlebar import TitleBar

MAX_SPARK_POINTS = 400  # the sparkline buckets into its width; more points only cost copying


class SnapshotReady(Message):
    def __init__(self, snap: Snapshot):
        super().__init__()
        self.snap = snap


class ActionDone(Message):
    def __init__(self, text: str, severity: str = "information"):
        super().__init__()
        self.text = text
        self.severity = severity


class MonitorScreen(Screen):
    HELP = ("Live view of one run, read from its run directory. Closing the TUI never "
            "touches the run. A graceful stop lets the ranks finish their step and "
            "checkpoint; after the grace period everything left is killed. A stalled run: "
            "`d` shows every rank's Python stack; the rank not inside a collective is the "
            "one the others wait for.")
    BINDINGS = [
        Binding("escape", "back", "Runs"),
        Binding("s", "stop", "Stop"),
        Binding("K", "kill", "Kill now"),
        Binding("d", "stacks", "Stack dumps"),
        Binding("G", "follow", "Follow log", show=False),
    ]

    def __init__(self, run_ref: str):
        super().__init__()
        self.run_ref = run_ref
        self.watcher: RunWatcher | None = None
        self.snap: Snapshot | None = None
        self._polling = threading.Lock()

    def compose(self) -> ComposeResult:
        yield TitleBar("monitor")
        yield Static(f"run {self.run_ref}", id="monitor-title")
        yield Static("reading…", id="monitor-stats")
        yield Static("", id="gpu-panel")
        yield Static("", id="findings-panel")
        yield Static("loss", id="loss-label")
        yield Sparkline([], id="loss-spark")
        yield Static("rank 0 log", id="log-label")
        yield Log(id="rank-log", max_lines=2000, auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(self.app.refresh_s, self.poll)

    def on_unmount(self) -> None:
        if self.watcher is not None:
            self.watcher.close()

    # -- data (thread) ------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="monitor-poll", exit_on_error=False)
    def poll(self) -> None:
        # exclusive= cannot stop a thread already running: on a slow filesystem the ticks
        # would pile up polls of the same watcher; a tick that finds one running skips
        if not self._polling.acquire(blocking=False):
            return
        try:
            self._poll()
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
            self.watcher = RunWatcher(run.run_dir)
        self.post_message(SnapshotReady(self.watcher.poll()))

    # -- view (UI thread) ---------------------------------------------------------------
    @on(SnapshotReady)
    def show(self, msg: SnapshotReady) -> None:
        snap = self.snap = msg.snap
        run = snap.run
        if run is None:
            return
        title = f"{run.name}  ·  {run.run_id}  ·  {run.status}"
        if run.message:
            title += f"  ·  {run.message}"
        self.query_one("#monitor-title", Static).update(title)
        last = snap.last_step or {}
        loss = last.get("loss")
        lr = last.get("lr")
        pct = 100.0 * run.step / run.max_steps if run.max_steps else 0.0
        parts = [f"step [b]{run.step}/{run.max_steps}[/b] ({pct:.0f}%)",
                 f"loss [b]{fmt_loss(loss)}[/b]"]
        if isinstance(lr, (int, float)):
            parts.append(f"lr {lr:.2e}")
        parts += [f"tokens/s [b]{fmt_rate(snap.tokens_per_s)}[/b]",
                  f"ETA [b]{fmt_duration(snap.eta_s)}[/b]"]
        stats = "   ".join(parts)
        if snap.checkpoints:
            stats += f"\nlast checkpoint {snap.checkpoints[-1]}"
        self.query_one("#monitor-stats", Static).update(stats)
        if snap.losses:
            first, low = snap.losses[0], min(snap.losses)
            self.query_one("#loss-label", Static).update(
                f"loss  first {first:.4f}  min {low:.4f}  last {snap.losses[-1]:.4f}  "
                f"({len(snap.losses)} steps)")
            self.query_one("#loss-spark", Sparkline).data = _decimate(snap.losses,
                                                                     MAX_SPARK_POINTS)
        self.query_one("#gpu-panel", Static).update(_gpu_lines(snap.telemetry))
        self.query_one("#findings-panel", Static).update(_finding_lines(snap.findings,
                                                                         run.run_id))
        log = self.query_one("#rank-log", Log)
        if snap.log_reset:
            log.clear()
        if snap.new_log_lines:
            log.write_lines(snap.new_log_lines)

    @property
    def loss_shown(self) -> float | None:
        """The loss the stats line shows (tests compare it with the last event)."""
        if self.snap and self.snap.last_step:
            return self.snap.last_step.get("loss")
        return None

    # -- actions ------------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_follow(self) -> None:
        self.query_one("#rank-log", Log).scroll_end(animate=False)

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
        q = (f"Kill every process of {run.run_id} now (SIGKILL, no checkpoint)?" if hard else
             f"Stop {run.run_id}?\nRanks finish their step and write a checkpoint; anything "
             f"still alive after the grace period is killed.")

        def answered(yes: bool | None) -> None:
            if yes:
                self.request_stop(hard)

        self.app.push_screen(ConfirmScreen(q), answered)

    @work(thread=True, exclusive=True, group="monitor-stop", exit_on_error=False)
    def request_stop(self, hard: bool) -> None:
        from tunedeck.core.runs.control import request_stop

        try:
            request_stop(find_run(self.run_ref), hard=hard)
        except Exception as e:  # shown to the user, never raised into the UI
            self.post_message(ActionDone(f"stop failed: {e}", "error"))
            return
        self.post_message(ActionDone("hard stop requested" if hard else
                                     "graceful stop requested"))

    def action_stacks(self) -> None:
        run = self.snap.run if self.snap else None
        if run is None or not run.needs_stop:
            self.notify("this run is not running: no stacks to dump", severity="warning")
            return
        self.notify("asking every rank for its stack...")
        self.dump_stacks(run.run_dir)

    @work(thread=True, exclusive=True, group="monitor-stacks", exit_on_error=False)
    def dump_stacks(self, run_dir) -> None:
        from tunedeck.core.runs.stacks import dump_stacks

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


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _bar(pct: float, width: int = 10) -> str:
    filled = int(round(max(0.0, min(pct, 100.0)) / 100 * width))
    return "█" * filled + "░" * (width - filled)


def _gpu_lines(tel: dict) -> str:
    """One line per GPU from the agent's latest telemetry sample."""
    status = tel.get("status") or {}
    if not tel:
        return ""
    if status.get("nvml") not in (None, "ok"):
        return f"[dim]GPUs: {status.get('message') or status.get('nvml')}[/dim]"
    lines = []
    for g in tel.get("gpus") or []:
        util = g.get("util")
        used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
        mem_pct = 100 * used / total if isinstance(used, (int, float)) and total else None
        parts = [f"GPU{g.get('gpu')}",
                 f"util {_bar(util) if isinstance(util, (int, float)) else '   N/A    '} "
                 f"{util if isinstance(util, (int, float)) else 'N/A':>4}%"]
        if mem_pct is not None:
            parts.append(f"mem {_bar(mem_pct)} {used / 1024:5.1f}/{total / 1024:.0f} GiB")
        for key, unit in (("power_w", "W"), ("temp_c", "°C")):
            if isinstance(g.get(key), (int, float)):
                parts.append(f"{g[key]:.0f}{unit}")
        lines.append("  ".join(parts))
    host = tel.get("host") or {}
    if host:
        lines.append(f"[dim]host cpu {host.get('cpu_pct', 0):.0f}%  mem "
                     f"{host.get('mem_used_mib', 0) / 1024:.1f}/"
                     f"{host.get('mem_total_mib', 0) / 1024:.0f} GiB  /dev/shm free "
                     f"{host.get('shm_free_mib', 0) / 1024:.1f} GiB[/dim]")
    return "\n".join(lines)


def _finding_lines(findings: list[dict], run_id: str, limit: int = 4) -> str:
    if not findings:
        return ""
    out = []
    for f in findings[:limit]:
        style = SEVERITY_STYLE.get(f.get("severity"), "")
        rank = f" rank {f['rank']}" if f.get("rank") is not None else ""
        tag = "" if f.get("root_cause", True) else " (consequence)"
        out.append(f"[{style}]● {f.get('category')}{rank}[/]{tag}: {escape(f.get('summary', ''))}"
                   f"\n    fix: {escape(f.get('fix', ''))}")
    if len(findings) > limit:
        out.append(f"[dim]… {len(findings) - limit} more: tunedeck diagnose {run_id}[/dim]")
    return "\n".join(out)


def _decimate(values: list[float], n: int) -> list[float]:
    """At most n points; each bucket keeps its max so loss spikes stay visible."""
    if len(values) <= n:
        return values
    size = len(values) / n
    return [max(values[int(i * size):max(int((i + 1) * size), int(i * size) + 1)])
            for i in range(n)]
