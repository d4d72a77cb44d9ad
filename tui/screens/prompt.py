"""A one-line text question (a spec file's path, a pasted launch command): Enter answers with
the text, Esc with None."""

from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tunedeck.tui.screens.base import ReadonlyAware


def join_pasted_lines(text: str) -> str:
    """A command pasted from a shell script spans lines ending in `\\`: one line of words."""
    parts = [line.strip().removesuffix("\\").strip() for line in text.splitlines()]
    return " ".join(p for p in parts if p)


class CommandInput(Input):
    """An Input that keeps every line of a paste (Textual's keeps only the first)."""

    def _on_paste(self, event: events.Paste) -> None:
        event.prevent_default()  # Input's own handler would insert the first line again
        event.stop()
        if event.text:
            self.insert_text_at_cursor(join_pasted_lines(event.text))


class PromptScreen(ReadonlyAware, ModalScreen[str | None]):
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    #prompt-box { width: 90%; max-width: 120; height: auto; padding: 1 2;
                  border: thick $accent; background: $surface; }
    #prompt-hint { color: $text-muted; margin-top: 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self, question: str, placeholder: str = "", value: str = "", multiline_paste: bool = False
    ):
        super().__init__()
        self.question = question
        self.placeholder = placeholder
        self.value = value
        self.multiline_paste = multiline_paste

    def compose(self) -> ComposeResult:
        cls = CommandInput if self.multiline_paste else Input
        with Vertical(id="prompt-box"):
            yield Static(self.question, id="prompt-question", markup=False)
            yield cls(value=self.value, placeholder=self.placeholder, id="prompt-input")
            yield Static("enter to accept · esc to cancel", id="prompt-hint")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
