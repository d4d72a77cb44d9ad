"""Raw output → logical lines.

Training consoles are messy: tqdm redraws its bar with `\\r` and a metrics dict printed by
`tqdm.write` lands on the same physical line (`Train: 12%|█| 12/100 [..]\\r{'loss': ...}`);
a terminal or a log collector may hard-wrap a long dict in the middle of a number. The
assembler splits on `\\r`, drops the superseded bar redraws (only the last one on a line is
kept, so a 10-hour run does not yield millions of bar updates), and joins a dict that was
cut across lines back together before anyone parses it.
"""

from __future__ import annotations

# A dict that never closes is given up after this many lines (it was not a dict after all).
MAX_WRAPPED_LINES = 64


class LineAssembler:
    """Feed raw text as it arrives (`feed`) or complete lines (`feed_lines`); get logical lines.

    Text after the last newline is held until the next feed, so it is safe to call with
    arbitrary chunks. State is a few short strings, so one assembler per file is cheap.
    """

    def __init__(self) -> None:
        self._partial = ""  # text after the last newline of the previous feed
        self._open: list[str] = []  # pieces of a dict that has not closed yet

    @property
    def is_open(self) -> bool:
        """A hard-wrapped dict is being joined: every next line belongs to it."""
        return bool(self._open)

    def feed(self, text: str) -> list[str]:
        text = self._partial + text
        cut = text.rfind("\n")
        if cut < 0:
            self._partial = text
            return []
        self._partial = text[cut + 1 :]
        return self.feed_lines(text[:cut].split("\n"))

    def feed_lines(self, lines) -> list[str]:
        out: list[str] = []
        for raw in lines:
            if "\r" in raw:
                self._segments(raw, out)
            else:
                self._one(raw.rstrip("\n"), out)
        return out

    def flush(self) -> list[str]:
        """Whatever is held back (end of file): an unclosed dict and a partial last line."""
        out = list(self._open and ["".join(self._open)] or [])
        self._open = []
        if self._partial:
            out.append(self._partial)
            self._partial = ""
        return out

    # -- internals ---------------------------------------------------------------------

    def _segments(self, raw: str, out: list[str]) -> None:
        parts = [p for p in raw.rstrip("\n").split("\r") if p.strip()]
        # keep dicts and other text; of consecutive bar redraws keep only the last
        for i, p in enumerate(parts):
            nxt = parts[i + 1] if i + 1 < len(parts) else None
            if nxt is not None and _is_bar(p) and _is_bar(nxt):
                continue
            self._one(p, out)

    def _one(self, line: str, out: list[str]) -> None:
        if self._open:
            self._open.append(line)
            if "}" in line or len(self._open) >= MAX_WRAPPED_LINES:
                joined = "".join(self._open)
                self._open = []
                out.append(joined)
            return
        # a dict glued to the end of a bar without \r: split it off
        brace = line.find("{'")
        if brace < 0:
            brace = line.find('{"')
        if brace > 0 and "|" in line[:brace]:
            out.append(line[:brace])
            line = line[brace:]
            brace = 0
        if brace == 0 and "}" not in line:
            self._open = [line]
            return
        out.append(line)


def _is_bar(s: str) -> bool:
    return "%|" in s and "|" in s[s.find("%|") + 2 :]
