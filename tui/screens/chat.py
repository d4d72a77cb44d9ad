"""Chat: ask a run's checkpoint a question and read its answer beside the base model's.

`ChatScreen(source)`: a prompt line, two panes (the base model left, the checkpoint right)
and a line of timings under each. The model loads in a thread worker when the screen opens;
each prompt is answered in another thread worker, base first then tuned (one model in memory:
the adapter is switched off for the base). The workers never touch widgets: they post a
message per decoded piece, and the handlers append it, so the answer streams while the event
loop stays free (Esc leaves at any time; the worker's answer is then dropped)."""

from __future__ import annotations

from rich.markup import escape
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Static

from tunedeck.tui.widgets.footer import Footer
from tunedeck.core.api import Answer, Chat, ModelSource, clean
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.widgets.titlebar import TitleBar


class ModelLoaded(Message):
    def __init__(self, chat: Chat | None, error: str = ""):
        super().__init__()
        self.chat, self.error = chat, error


class Piece(Message):
    """A decoded piece of one side's answer (side: "base" or "tuned")."""

    def __init__(self, side: str, text: str):
        super().__init__()
        self.side, self.text = side, text


class AnswerDone(Message):
    def __init__(self, side: str, answer: Answer, error: str = ""):
        super().__init__()
        self.side, self.answer, self.error = side, answer, error


class ChatScreen(TunedeckScreen):
    HELP = (
        "Type a prompt and press Enter: the base model answers on the left, the chosen "
        "checkpoint on the right, each streamed as it is decoded (greedy, the model's chat "
        "template), with time to first token and tokens/s under it."
    )
    DEFAULT_CSS = """
    ChatScreen #chat-panes { height: 1fr; }
    ChatScreen .chat-side { width: 1fr; border: round $panel; padding: 0 1; }
    ChatScreen .chat-stats { height: 1; padding: 0 1; color: $text-muted; }
    ChatScreen #chat-status { height: 1; padding: 0 1; }
    """
    BINDINGS = [Binding("escape", "back", "Back")]

    def __init__(self, source: ModelSource, device: str = "auto", max_new_tokens: int = 96):
        super().__init__()
        self.source, self.device, self.max_new_tokens = source, device, max_new_tokens
        self.chat: Chat | None = None
        self.busy = False
        self.text = {"base": "", "tuned": ""}

    def compose(self) -> ComposeResult:
        yield TitleBar(f"chat · {self.source.run_id} · step {self.source.step}")
        yield Static("loading the model…", id="chat-status")
        yield Input(placeholder="loading the model…", id="chat-prompt", disabled=True)
        with Horizontal(id="chat-panes"):
            for side, title in (("base", "base model"), ("tuned", f"step {self.source.step}")):
                with VerticalScroll(classes="chat-side", id=f"chat-{side}-pane") as pane:
                    pane.border_title = title
                    yield Static("", id=f"chat-{side}", markup=False)
        with Horizontal(id="chat-stats-row", classes="chat-stats"):
            yield Static("", id="chat-base-stats", classes="chat-side-stats")
            yield Static("", id="chat-tuned-stats", classes="chat-side-stats")
        yield Footer()

    def on_mount(self) -> None:
        for s in self.query(".chat-side-stats"):
            s.styles.width = "1fr"
        self.load_model()

    # -- workers (threads: they post, never touch a widget) -----------------------------
    @work(thread=True, group="chat-load", exit_on_error=False)
    def load_model(self) -> None:
        try:
            chat = Chat(self.source, device=self.device)
        except Exception as e:  # noqa: BLE001 - shown on the screen
            self.post_message(ModelLoaded(None, f"{type(e).__name__}: {e}"))
            return
        self.post_message(ModelLoaded(chat))

    @work(thread=True, group="chat-answer", exclusive=True, exit_on_error=False)
    def answer(self, prompt: str) -> None:
        for side in ("base", "tuned"):
            a = Answer()
            try:
                for piece in self.chat.stream(prompt, side == "tuned", self.max_new_tokens, a):
                    self.post_message(Piece(side, piece))
            except Exception as e:  # noqa: BLE001 - shown on the screen
                self.post_message(AnswerDone(side, a, f"{type(e).__name__}: {e}"))
                return
            self.post_message(AnswerDone(side, a))

    # -- handlers (the event loop) ------------------------------------------------------
    @on(ModelLoaded)
    def model_loaded(self, msg: ModelLoaded) -> None:
        status = self.query_one("#chat-status", Static)
        if msg.chat is None:
            status.update(f"[red]cannot load the model:[/] {escape(clean(msg.error))}")
            return
        self.chat = msg.chat
        status.update(f"ready on {escape(msg.chat.device)}: type a prompt, Enter to ask both")
        box = self.query_one("#chat-prompt", Input)
        box.disabled, box.placeholder = False, "prompt (Enter: base and tuned answer)"
        box.focus()

    @on(Input.Submitted, "#chat-prompt")
    def ask(self, event: Input.Submitted) -> None:
        prompt = event.value.strip()
        if not prompt or self.chat is None or self.busy:
            return
        self.busy = True
        for side in ("base", "tuned"):
            self.text[side] = ""
            self.query_one(f"#chat-{side}", Static).update("")
            self.query_one(f"#chat-{side}-stats", Static).update("waiting…")
        self.query_one("#chat-status", Static).update(f"answering: {escape(clean(prompt))}")
        self.answer(prompt)

    @on(Piece)
    def piece(self, msg: Piece) -> None:
        self.text[msg.side] += msg.text
        self.query_one(f"#chat-{msg.side}", Static).update(
            clean(self.text[msg.side], multiline=True)
        )
        self.query_one(f"#chat-{msg.side}-stats", Static).update("streaming…")

    @on(AnswerDone)
    def answer_done(self, msg: AnswerDone) -> None:
        a = msg.answer
        stats = self.query_one(f"#chat-{msg.side}-stats", Static)
        if msg.error:
            stats.update(f"[red]failed:[/] {escape(clean(msg.error))}")
        else:
            rate = f"{a.tokens_per_s:.1f} tok/s" if a.tokens_per_s else "– tok/s"
            stats.update(f"{a.tokens} tokens · first {a.ttft_s or 0:.2f} s · {rate}")
        if msg.side == "tuned" or msg.error:
            self.busy = False
            self.query_one("#chat-status", Static).update("done: type another prompt")

    def action_back(self) -> None:
        if isinstance(self.app, ChatApp):
            self.app.exit()
        else:
            self.app.pop_screen()


class ChatApp(App):
    """`tunedeck chat RUN`: the chat screen alone."""

    def __init__(self, source: ModelSource, **kw):
        super().__init__()
        self.readonly = False
        self._screen = ChatScreen(source, **kw)

    def on_mount(self) -> None:
        self.push_screen(self._screen)


def run_chat_app(source: ModelSource, **kw) -> int:
    ChatApp(source, **kw).run()
    return 0
