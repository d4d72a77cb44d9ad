"""The log pane: one rank's stdout and stderr (core/views/watch.py `RankLog`), shown through a
window of lines the view loads in a thread as it scrolls, so a 1 GB log is never read whole
nor held in memory (the widget keeps a few screens of lines).

Following never sticks: at the bottom the view keeps following new lines; scrolling up
pauses; `G` or End (or scrolling back to the bottom) resumes. `/` searches (smart case:
a query with a capital letter is case-sensitive), with every match highlighted and n/N to
move between them; `e` jumps to the first error line (a traceback, an `...Error`). Lines from
stderr carry a red mark in the gutter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events, work
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input

from tunedeck.core.api import Literal, LogState, RankLog

SEARCH_LIMIT = 10000
KEEP_SCREENS = 6  # lines cached around the viewport, in screen heights
GUTTER = 2
HIT_STYLE = Style(color="black", bgcolor="yellow")
CURRENT_STYLE = Style(bgcolor="grey30")
ERR_GUTTER = Style(color="red", bold=True)
PLACEHOLDER = Style(dim=True)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """What a line shows: colour codes and other control characters out, tabs expanded
    (they would garble the cells around them)."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\t" in text:
        text = text.expandtabs(8)
    return _CONTROL.sub("", text)


@dataclass
class Query:
    text: str
    needle: Literal  # what the index searches the files for
    rx: re.Pattern[str]  # what the view highlights

    @classmethod
    def make(cls, text: str) -> "Query":
        exact = any(c.isupper() for c in text)  # smart case
        return cls(
            text,
            Literal(text.encode(), ignore_case=not exact),
            re.compile(re.escape(text), 0 if exact else re.IGNORECASE),
        )


class LogView(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    LogView {
        height: 1fr; background: $surface;
        scrollbar-size-vertical: 1; scrollbar-size-horizontal: 0;
    }
    """
    BINDINGS = [
        Binding("j", "scroll_down", "Down", show=False),
        Binding("k", "scroll_up", "Up", show=False),
        Binding("g", "scroll_home", "Top", show=False),
    ]

    class WindowLoaded(Message):
        def __init__(self, generation: int, start: int, lines: list[tuple[str, int]]):
            super().__init__()
            self.generation, self.start, self.lines = generation, start, lines

    class SearchDone(Message):
        def __init__(self, generation: int, query: Query, hits: list[int]):
            super().__init__()
            self.generation, self.query, self.hits = generation, query, hits

    class ErrorFound(Message):
        def __init__(self, generation: int, line: int | None):
            super().__init__()
            self.generation, self.line = generation, line

    class StatusChanged(Message):
        """The view's status line changed (rank, lines, follow, search)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.source: RankLog | None = None
        self.state: LogState | None = None
        self.generation = -1
        self.total = 0
        self.follow = True
        self.cache: dict[int, tuple[str, int]] = {}
        self.query: Query | None = None
        self.hits: list[int] = []
        self.hit = -1  # index into hits of the current match
        self.cursor: int | None = None  # the line a jump went to (highlighted)
        self.note = ""  # a transient word for the status line
        self._width = 0
        self._loading: tuple[int, int, int] | None = None
        self._auto = False  # scrolls this class makes (not the user's)
        self._want_window = False

    # -- data in ---------------------------------------------------------------------
    def set_state(self, state: LogState, source: RankLog) -> None:
        """A new index state from the monitor's log worker (UI thread)."""
        if source is self.source and state.moved_from == self.generation and state.moved_by:
            self._move(state)  # a big log's head arrived above what is shown
        elif source is not self.source or state.generation != self.generation:
            self.source, self.generation = source, state.generation
            self.cache.clear()
            # another rank or attempt: its own lines, so no search carries over
            self.query, self.note = None, ""
            self.hits, self.hit, self.cursor, self._loading = [], -1, None, None
            self.follow = True
            self._width = 0
        self.state = state
        if state.total != self.total or self.virtual_size.height != state.total:
            self.total = state.total
            self._set_virtual()
        if self.follow:
            self._scroll_end()
        self._ensure_window()
        self.post_message(self.StatusChanged())

    def _move(self, state: LogState) -> None:
        """Lines were placed above all others: everything shown moves down by as many,
        and the view stays on the same lines (or at the end, following)."""
        by = state.moved_by
        self.generation = state.generation
        self.cache = {i + by: v for i, v in self.cache.items()}
        self.hits = [h + by for h in self.hits]
        if self.cursor is not None:
            self.cursor += by
        self._loading = None
        self.total = state.total
        self._set_virtual()
        if not self.follow:
            self._auto = True
            try:
                self.scroll_to(y=self.scroll_offset.y + by, animate=False, force=True)
            finally:
                self._auto = False

    def _set_virtual(self) -> None:
        size = Size(self._width + GUTTER, self.total)
        self._auto = True
        try:
            scrollbar = size.height > self.container_size.height
            if scrollbar != self.show_vertical_scrollbar or not self.container_size:
                self.virtual_size = size  # the scrollbar comes or goes: a new layout
            else:
                # more lines in a box of the same size: no layout of the whole screen
                # (at 160x48 one costs tens of ms, and a followed log grows every second)
                self.set_reactive(Widget.virtual_size, size)
                self._scroll_update(size)
                self.refresh()
        finally:
            self._auto = False

    def _scroll_end(self) -> None:
        self._auto = True
        try:
            self.scroll_to(y=self.max_scroll_y, animate=False, force=True)
        finally:
            self._auto = False

    def _ensure_window(self) -> None:
        """Load the lines around the viewport that are not cached (in a thread)."""
        if self.source is None or not self.total:
            return
        h = max(self.size.height, 10)
        top = int(self.scroll_offset.y)
        want = range(top, min(top + h, self.total))
        if all(i in self.cache for i in want):
            return
        start = max(0, top - h)
        count = min(3 * h, self.total - start)
        key = (self.generation, start, count)
        if self._loading == key:
            return
        self._loading = key
        self._load(self.source, self.generation, start, count)

    @work(thread=True, exclusive=True, group="log-window", exit_on_error=False)
    def _load(self, source: RankLog, generation: int, start: int, count: int) -> None:
        lines = [(clean(t), fd) for t, fd in source.lines(start, count)]
        self.post_message(self.WindowLoaded(generation, start, lines))

    def on_log_view_window_loaded(self, msg: "LogView.WindowLoaded") -> None:
        msg.stop()
        if msg.generation != self.generation:
            return
        self._loading = None
        for i, entry in enumerate(msg.lines, msg.start):
            self.cache[i] = entry
        widest = max((len(t) for t, _ in msg.lines), default=0)
        if widest > self._width:
            self._width = widest
            self._set_virtual()
        self._prune()
        self.refresh()
        self._ensure_window()

    def _prune(self) -> None:
        keep = KEEP_SCREENS * max(self.size.height, 10)
        if len(self.cache) <= 2 * keep:
            return
        top = int(self.scroll_offset.y)
        for i in [i for i in self.cache if abs(i - top) > keep]:
            del self.cache[i]

    # -- drawing ---------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        i = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if i >= self.total:
            return Strip.blank(width, base)
        entry = self.cache.get(i)
        if entry is None:
            if not self._want_window:
                self._want_window = True
                self.call_after_refresh(self._window_after_refresh)
            return Strip([Segment("  …", base + PLACEHOLDER)]).crop_extend(0, width, base)
        text, fd = entry
        line = Text(text, no_wrap=True, end="")
        if self.query is not None:
            for m in self.query.rx.finditer(text):
                line.stylize(HIT_STYLE, m.start(), m.end())
        gutter = Segment(
            "▌ " if fd == RankLog.STDERR else "  ",
            base + ERR_GUTTER if fd == RankLog.STDERR else base,
        )
        style = base + CURRENT_STYLE if i == self.cursor else base
        segs = list(line.render(self.app.console))
        strip = Strip(
            [Segment(s.text, style + s.style if s.style else style) for s in segs if s.text]
        )
        strip = strip.crop_extend(scroll_x, scroll_x + width - GUTTER, style)
        return Strip([gutter, *strip]).apply_offsets(scroll_x, i)

    def _window_after_refresh(self) -> None:
        self._want_window = False
        self._ensure_window()

    # -- scrolling and follow --------------------------------------------------------
    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._auto:
            return
        at_end = new_value >= self.max_scroll_y
        if at_end and not self.follow:
            self.follow = True
            self.post_message(self.StatusChanged())
        elif new_value < old_value and not at_end and self.follow:
            self.follow = False
            self.post_message(self.StatusChanged())
        self._ensure_window()

    def on_resize(self, event: events.Resize) -> None:
        if self.follow:
            self._scroll_end()
        self._ensure_window()

    def action_follow(self) -> None:
        """G / End: back to the newest line, and keep following."""
        self.follow = True
        self.cursor = None
        self._scroll_end()
        self.refresh()
        self._ensure_window()
        self.post_message(self.StatusChanged())

    def action_scroll_end(self) -> None:
        self.action_follow()

    # a log scrolls at once: an animation would draw the lines it passes, each a window
    # the view loads and then drops
    def action_page_up(self) -> None:
        self.scroll_page_up(animate=False)

    def action_page_down(self) -> None:
        self.scroll_page_down(animate=False)

    def action_scroll_up(self) -> None:
        self.scroll_up(animate=False)

    def action_scroll_down(self) -> None:
        self.scroll_down(animate=False)

    def action_scroll_home(self) -> None:
        self.goto(0, center=False)

    def goto(self, line: int, center: bool = True) -> None:
        """Show `line` (a third from the top) and stop following."""
        if not self.total:
            return
        line = max(0, min(line, self.total - 1))
        self.follow = False
        self.cursor = line
        h = self.size.height or 10
        self._auto = True
        try:
            self.scroll_to(y=max(0, line - h // 3) if center else line, animate=False, force=True)
        finally:
            self._auto = False
        self.refresh()
        self._ensure_window()
        self.post_message(self.StatusChanged())

    # -- search and errors ------------------------------------------------------------
    def search(self, text: str) -> None:
        if self.source is None or not text:
            return
        self.query = Query.make(text)
        self.hits, self.hit = [], -1
        self.note = "searching…"
        self.post_message(self.StatusChanged())
        self._search(self.source, self.generation, self.query)

    @work(thread=True, exclusive=True, group="log-search", exit_on_error=False)
    def _search(self, source: RankLog, generation: int, query: Query) -> None:
        hits = source.search(query.needle, SEARCH_LIMIT)
        self.post_message(self.SearchDone(generation, query, hits))

    def on_log_view_search_done(self, msg: "LogView.SearchDone") -> None:
        msg.stop()
        if msg.query is not self.query:
            return
        if msg.generation != self.generation:  # the view moved meanwhile: again
            self.search(msg.query.text)
            return
        self.hits = msg.hits
        self.note = "" if msg.hits else "no match"
        self.refresh()
        if msg.hits:
            top = int(self.scroll_offset.y)
            after = [i for i, h in enumerate(msg.hits) if h >= top]
            self.hit = (
                after[0] if after and not self.follow else (len(msg.hits) - 1 if self.follow else 0)
            )
            self.goto(msg.hits[self.hit])
        else:
            self.post_message(self.StatusChanged())

    def next_hit(self, step: int = 1) -> None:
        if not self.hits:
            self.note = "no search" if self.query is None else "no match"
            self.post_message(self.StatusChanged())
            return
        self.hit = (self.hit + step) % len(self.hits)
        self.note = ""
        self.goto(self.hits[self.hit])

    def first_error(self) -> None:
        if self.source is None:
            return
        self.note = "looking for errors…"
        self.post_message(self.StatusChanged())
        self._first_error(self.source, self.generation)

    @work(thread=True, exclusive=True, group="log-search", exit_on_error=False)
    def _first_error(self, source: RankLog, generation: int) -> None:
        self.post_message(self.ErrorFound(generation, source.first_error()))

    def on_log_view_error_found(self, msg: "LogView.ErrorFound") -> None:
        msg.stop()
        if msg.generation != self.generation:  # the view moved meanwhile: again
            self.first_error()
            return
        if msg.line is None:
            self.note = "no error line"
            self.post_message(self.StatusChanged())
            return
        self.note = "first error"
        self.goto(msg.line)

    # -- for the status line and tests -------------------------------------------------
    def status(self) -> str:
        st = self.state
        if st is None:
            return "reading…"
        parts = [f"rank {st.rank}"]
        if st.attempt:
            parts.append(st.attempt)
        parts.append(f"{self.total:,} lines")
        if st.size and st.indexed < st.size:
            parts.append(f"indexing {100 * st.indexed / st.size:.0f}%")
        parts.append("following" if self.follow else "paused · G/End follows")
        if self.query is not None:
            pos = f"{self.hit + 1}/{len(self.hits)}" if self.hits else "0"
            more = "+" if len(self.hits) >= SEARCH_LIMIT else ""
            parts.append(f"/{self.query.text} {pos}{more}")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)

    def visible_lines(self) -> list[str]:
        """The text of the lines on screen (what is loaded of them)."""
        top = int(self.scroll_offset.y)
        return [
            self.cache[i][0] if i in self.cache else ""
            for i in range(top, min(top + self.size.height, self.total))
        ]


class SearchInput(Input):
    """`/` in the log pane; Enter searches, Escape gives up (without leaving the screen)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    class Cancelled(Message):
        pass

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())
