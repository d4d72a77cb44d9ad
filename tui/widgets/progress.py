"""The progress pane: where the run stands (step, epoch, loss, speed, ETA, data wait) and its
status with the reason in full: the text wraps, it is never cut."""

from __future__ import annotations

import time

from rich.markup import escape
from rich.text import Text

from tunedeck.core.api import Snapshot
from tunedeck.tui.format import RUN_STATUS_STYLE, fmt_duration, fmt_loss, fmt_rate
from tunedeck.tui.widgets.fit import FitStatic
from tunedeck.tui.widgets.panes import colour_bar, fmt_pct

STARVED = 0.10  # a data-wait share worth a colour (the starvation detector warns at ~10 %)


def flow(chunks: list[str], width: int, sep: str = "   ") -> list[str]:
    """Markup chunks laid out in lines of at most `width` cells, never splitting a chunk
    (a chunk wider than the line gets a line of its own and wraps there)."""
    lines: list[str] = []
    cur, used = "", 0
    for c in chunks:
        w = Text.from_markup(c).cell_len
        if cur and used + len(sep) + w > width:
            lines.append(cur)
            cur, used = "", 0
        cur, used = (cur + sep + c, used + len(sep) + w) if cur else (c, w)
    if cur:
        lines.append(cur)
    return lines


def progress_text(snap: Snapshot, width: int = 80) -> str:
    """The status word and the numbers first (what a glance needs, in as few lines as the
    width allows), then the status's reason in full: wrapped, never cut."""
    run, p = snap.run, snap.progress
    if run is None:
        return "[dim]no state.json yet[/dim]"
    style = RUN_STATUS_STYLE.get(run.status, "")
    status = run.status
    if run.state.get("stop_requested") and run.active:
        # the ~grace period between `s` and the stop being recorded is a state of its own
        status, style = f"stopping ({run.state['stop_requested']})", "bold yellow"
    chunks = [f"[{style}]{status}[/]" if style else status]
    frac = p.step / p.max_steps if p.max_steps else None
    bar_w = max(4, min(20, width // 6))
    chunks.append(
        f"step [b]{p.step}/{p.max_steps}[/b] {colour_bar(frac, bar_w, 'green')} "
        f"{fmt_pct(frac, 0) if frac is not None else ''}".rstrip()
    )
    chunks.append(f"loss [b]{fmt_loss(p.loss)}[/b]")
    if p.epoch is not None:
        chunks.append(f"epoch {p.epoch:.2f}")
    if p.lr is not None:
        chunks.append(f"lr {p.lr:.2e}")
    chunks += [
        f"tokens/s [b]{fmt_rate(p.tokens_per_s)}[/b]",
        f"MFU {fmt_pct(p.mfu)}",
        f"ETA [b]{fmt_duration(p.eta_s)}[/b]",
    ]
    if p.elapsed_s is not None:
        chunks.append(f"elapsed {fmt_duration(p.elapsed_s)}")
    if p.data_wait is not None:
        hot = p.data_wait >= STARVED or (p.worst_wait and p.worst_wait[1] >= STARVED)
        wait = f"data wait {fmt_pct(p.data_wait)}"
        if p.worst_wait is not None and p.ranks > 1:
            wait += f" (worst rank {p.worst_wait[0]} {fmt_pct(p.worst_wait[1])})"
        chunks.append(f"[yellow]{wait}[/]" if hot else wait)
    else:
        chunks.append("data wait -")
    if snap.phase is not None:  # a compile between steps: say so rather than look stuck
        est = snap.phase.get("est_s")
        since = (
            fmt_duration(max(0.0, time.time() - snap.phase["t"]))
            if isinstance(snap.phase.get("t"), (int, float))
            else "-"
        )
        ph = snap.phase
        if ph.get("phase") == "tokenizing":  # the data stage before step 1
            eta = ph.get("eta_s")
            chunks.insert(
                1,
                f"[bold yellow]tokenizing[/] {ph.get('done', 0)}/{ph.get('total', '?')} samples"
                f" ({ph.get('rate', 0):.0f}/s"
                + (f", ETA {fmt_duration(eta)}" if isinstance(eta, (int, float)) else "")
                + ")",
            )
            if ph.get("warning"):
                chunks.append("[bold red]warning:[/] " + escape(str(ph["warning"])))
        else:
            chunks.insert(
                1,
                f"[bold yellow]compiling[/] a new batch shape "
                f"({'~' + fmt_duration(est) + ', ' if est else ''}{since} so far)",
            )
    lines = flow(chunks, max(width, 20))
    if snap.fallback is not None:
        lines.append(
            "[yellow]compile failed, training eager:[/] "
            + escape(str(snap.fallback.get("error") or "")[:200])
        )
    for n in snap.nodes:
        lines.append(node_line(n))
    if run.message:
        lines.append(f"[{style or 'b'}]{run.status}:[/] {escape(run.message)}")
    extra = []
    if run.state.get("stop_requested"):
        extra.append(f"stop requested ({run.state['stop_requested']})")
    if run.state.get("attempt"):
        extra.append(f"attempt {run.state['attempt']}")
    if run.exit_code is not None:
        extra.append(f"exit code {run.exit_code}")
    if snap.checkpoints:
        extra.append(
            "last checkpoint " + escape(snap.checkpoints[-1].rstrip("/").rsplit("/", 1)[-1])
        )
    if extra:
        lines.append("[dim]" + " · ".join(extra) + "[/dim]")
    return "\n".join(lines)


def node_line(n: dict) -> str:
    """One node of a multi-node run: where it is, how its link to the head is, what it does."""
    reach = str(n.get("reach") or "-")
    style = {"connected": "green", "here": "green", "done": "dim", "shared fs": "green"}.get(
        reach, "yellow"
    )
    parts = [
        f"node {n.get('node')} [b]{escape(str(n.get('host') or '?'))}[/b]",
        escape(str(n.get("status") or "-")),
        f"[{style}]{escape(reach)}[/]",
    ]
    if n.get("shared_fs"):  # its records are written in place: nothing to stream or lose
        parts.append("[dim]shared fs[/]")
    if n.get("drops"):
        parts.append(f"{n['drops']} drop(s)")
    if n.get("step") is not None:
        parts.append(f"step {n['step']}")
    if n.get("slowest_rank") is not None:
        parts.append(f"slowest rank {n['slowest_rank']}")
    if n.get("gpus"):
        parts.append(f"{n['gpus']} GPU(s)")
    if n.get("findings"):
        parts.append(f"[yellow]{n['findings']} finding(s)[/]")
    if n.get("slurm"):
        parts.append(f"Slurm {escape(str(n['slurm'].get('state')))}")
    return "  " + " · ".join(parts)


def _height(markup: str, width: int) -> int:
    return (
        sum(max(1, -(-Text.from_markup(ln).cell_len // max(width, 1))) for ln in markup.split("\n"))
        if markup
        else 0
    )


class ProgressView(FitStatic):
    """The progress text; re-rendered only when it changed."""

    DEFAULT_CSS = "ProgressView { height: auto; }"

    def __init__(self, **kw):
        super().__init__("reading…", **kw)
        self._text = ""
        self._snap: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        width = self.size.width or 80
        text = progress_text(snap, width)
        if text != self._text:
            # a new layout only when the height changes (the ETA ticks every refresh)
            layout = _height(text, width) != _height(self._text, width)
            self._text = text
            self.update(text, layout=layout)

    def on_resize(self) -> None:
        if self._snap is not None:
            self.show(self._snap)

    @property
    def text(self) -> str:
        return self._text
