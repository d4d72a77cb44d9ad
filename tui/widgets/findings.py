"""The findings pane: what the agent and the log diagnosis found, root causes first, each with
its rank, summary and fix in the list; Enter opens its cause and evidence lines."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def finding_key(f: dict[str, Any]) -> tuple:
    return (f.get("category"), f.get("rank"), f.get("node"), f.get("summary"))


def finding_prompt(f: dict[str, Any]) -> Text:
    style = SEVERITY_STYLE.get(f.get("severity"), "")
    where = f" rank {f['rank']}" if f.get("rank") is not None else ""
    tag = "" if f.get("root_cause", True) else " [dim](consequence)[/dim]"
    return Text.from_markup(
        f"[{style}]● {escape(str(f.get('category')))}{where}[/]{tag}: "
        f"{escape(f.get('summary', ''))}\n  [dim]fix:[/dim] {escape(f.get('fix', ''))}"
    )


def finding_detail(f: dict[str, Any]) -> str:
    style = SEVERITY_STYLE.get(f.get("severity"), "")
    where = ", ".join(
        x
        for x in (
            f"node {f['node']}" if f.get("node") is not None else "",
            f"rank {f['rank']}" if f.get("rank") is not None else "",
        )
        if x
    )
    role = "root cause" if f.get("root_cause", True) else "consequence of an earlier failure"
    lines = [
        f"[{style}]{escape(str(f.get('category')))}[/] · {f.get('severity')} · {role}"
        + (f" · {where}" if where else ""),
        "",
        f"[b]{escape(f.get('summary', ''))}[/b]",
        "",
        f"[b]cause[/b]  {escape(f.get('cause', ''))}",
        "",
        f"[b]fix[/b]    {escape(f.get('fix', ''))}",
    ]
    evidence = f.get("evidence") or []
    if evidence:
        lines += ["", "[b]evidence[/b]"] + [f"  [dim]│[/dim] {escape(str(e))}" for e in evidence]
    if f.get("source"):
        lines += ["", f"[dim]source: {escape(str(f['source']))}[/dim]"]
    return "\n".join(lines)


class FindingsList(OptionList):
    """One option per finding (two lines: what, and the fix)."""

    DEFAULT_CSS = "FindingsList { height: 1fr; border: none; padding: 0; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.findings: list[dict[str, Any]] = []
        self.keys: list[tuple] | None = None

    def show(self, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Replace the list when it changed; returns the findings that are new."""
        keys = [finding_key(f) for f in findings]
        if keys == self.keys and findings == self.findings:
            return []
        old = set(self.keys or ())
        new = [f for f, k in zip(findings, keys) if k not in old]
        keep = self.highlighted
        self.findings, self.keys = findings, keys
        self.clear_options()
        if findings:
            self.add_options([Option(finding_prompt(f)) for f in findings])
            self.highlighted = min(keep or 0, len(findings) - 1)
        else:
            self.add_option(
                Option(
                    Text.from_markup(
                        "[dim]nothing found so far: no failure, starvation, straggler or stall"
                        "[/dim]"
                    ),
                    disabled=True,
                )
            )
        return new

    @property
    def current(self) -> dict[str, Any] | None:
        i = self.highlighted
        return self.findings[i] if i is not None and i < len(self.findings) else None


class FindingScreen(ModalScreen[None]):
    """One finding in full: cause, fix and its evidence lines."""

    DEFAULT_CSS = """
    FindingScreen { align: center middle; }
    #finding-box {
        width: 90%; height: auto; max-height: 90%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    """
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, finding: dict[str, Any]):
        super().__init__()
        self.finding = finding

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="finding-box"):
            yield Static(finding_detail(self.finding), id="finding-text")
            yield Static("[dim]esc to close; all of them: tunedeck diagnose RUN[/dim]")
