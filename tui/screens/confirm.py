"""A yes/no question; destructive actions always go through it.

No is the default: it has the focus, so Enter keeps things as they are. A second, more
dangerous question (deleting a run's checkpoints) takes another key than `y` (`yes_key`), so
two quick presses of `y` never answer both.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tunedeck.tui.screens.base import ReadonlyAware


class ConfirmScreen(ReadonlyAware, ModalScreen[bool]):
    BINDINGS = [Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, yes_key: str = "y", yes_label: str = "Yes"):
        super().__init__()
        self.question = question
        self.yes_key = yes_key
        self.yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes_label} ({self.yes_key})", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_key(self, event: events.Key) -> None:
        # the yes key is per question, so it is not a class binding
        if event.key == self.yes_key:
            event.stop()
            self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
