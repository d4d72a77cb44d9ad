"""The NCCL pane: per rank the NCCL version, network and interface, channels, how it reaches
each peer (P2P, SHM, Socket, IB, NVLS...), and every NCCL warning or error from its logs,
highlighted (core/views/nccl.py reads them)."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.widget import Widget

from tunedeck.core.api import RankNccl
from tunedeck.tui.widgets.fit import relayout

ISSUES_SHOWN = 20  # per rank; the rest are counted


def nccl_text(ranks: list[RankNccl] | None, width: int = 80) -> Text:
    if ranks is None:
        return Text.from_markup("[dim]reading the rank logs…[/dim]")
    seen = [r for r in ranks if r.nccl_lines or r.issues]
    if not seen:
        pending = [r for r in ranks if not r.caught_up]
        why = (
            "reading the rank logs…"
            if pending
            else "no NCCL lines in the rank logs: NCCL runs only with the nccl backend on GPUs, "
            "and says what it chose with NCCL_DEBUG=INFO (set it in the spec's env)"
        )
        return Text.from_markup(f"[dim]{why}[/dim]")
    out: list[str] = []
    for r in ranks:
        if not (r.nccl_lines or r.issues):
            out.append(f"[b]rank {r.rank}[/b] [dim]no NCCL lines[/dim]")
            continue
        head = [f"[b]rank {r.rank}[/b]"]
        if r.host:
            head.append(f"{escape(r.host)} pid {r.pid}")
        head.append(f"NCCL {escape(r.version)}" if r.version else "NCCL ?")
        net = r.network or "-"
        if r.interfaces:
            net += f" ({escape(', '.join(r.interfaces))})"
        head.append(f"net {net}")
        if r.ib_devices:
            head.append("IB " + escape(", ".join(r.ib_devices)))
        elif r.ib_missing:
            head.append("IB none")
        if r.coll_channels:
            ch = f"{r.coll_channels} coll"
            if r.p2p_channels:
                ch += f" / {r.p2p_channels} p2p"
            head.append(ch + " channels")
        if r.gdr is not None:
            head.append("GDR " + ("on" if r.gdr else "off"))
        if r.nranks:
            head.append(f"{r.nranks} ranks / {r.nnodes} node(s)")
        if r.issues:
            n_err = r.errors
            n_warn = len(r.issues) - n_err
            counts = [
                f"[bold red]{n_err} error{'s' if n_err != 1 else ''}[/]" if n_err else "",
                f"[yellow]{n_warn} warning{'s' if n_warn != 1 else ''}[/]" if n_warn else "",
            ]
            head.append(" ".join(c for c in counts if c))
        if not r.caught_up and r.bytes_total:
            head.append(f"[dim]read {100 * r.bytes_read / r.bytes_total:.0f}%[/dim]")
        out.append(" · ".join(head))
        for peer in sorted(r.peers.values(), key=lambda p: p.peer):
            out.append(
                f"  → rank {peer.peer:<3} [b]{peer.transport:<6}[/b] via "
                f"{escape(peer.via)}  {len(peer.channels)} channels"
            )
        for issue in r.issues[:ISSUES_SHOWN]:
            style = "red" if issue.level == "ERROR" else "yellow"
            out.append(
                f"  [bold {style}]{issue.level}[/] [dim]{issue.file}:{issue.line}[/dim] "
                f"[{style}]{escape(issue.text)}[/]"
            )
        if len(r.issues) > ISSUES_SHOWN:
            out.append(
                f"  [dim]… {len(r.issues) - ISSUES_SHOWN} more warnings/errors in "
                f"this rank's log[/dim]"
            )
    return Text.from_markup("\n".join(out))


class NcclView(Widget):
    DEFAULT_CSS = "NcclView { height: auto; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.ranks: list[RankNccl] | None = None

    def show(self, ranks: list[RankNccl] | None) -> None:
        """New summaries (None: nothing changed since the last ones)."""
        if ranks is None:
            return
        self.ranks = ranks
        relayout(self)

    def render(self) -> Text:
        return nccl_text(self.ranks, self.size.width or 80)

    @property
    def text(self) -> str:
        return nccl_text(self.ranks).plain
