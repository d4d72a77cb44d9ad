"""What a log line says, apart from who printed it and when: the one log-normalising front end.

Logs reach tunedeck through launchers, schedulers, containers and terminals, each adding its
own prefix to every line, and users paste them from wherever they looked: a tmux pane, a rich
traceback box, a k8s dashboard. `normalize(line)` strips those layers, outermost first, and
remembers what they said:

    2024-02-27T21:35:32.106Z | node-3: [rank5]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 5] ...
      ──────── time ────────   host     rank    ──── glog header ─────────   the message

so a rule matches the message, and the rank and node come from the prefix. The layers known:
ANSI colour codes, tmux status/copy-mode markers, rich box borders (`│ ... │`, `╭─ Traceback`),
ISO / `[date time,ms]` / clock-only stamps, glog headers (`E0629 00:06:21.246 123 file.py:9]`,
`[E ProcessGroupNCCL.cpp:1316]`), Python logging's `WARNING:name:` and DeepSpeed's
`[INFO] [launch.py:428:fn]`, torchrun's `[rank3]:` / `[default3]:`, Open MPI's `[1,3]<stdout>:`
and `[3] `, torchx's `[trainer0|3]:`,
determined's `<id> [rank=5] ||`, srun -l's `3:`, pdsh's `host: `, docker compose's
`service-1  | `, kubectl --prefix's `[pod/name/container]`, Ray's `(Worker pid=7046)`.

One separator space after a prefix is dropped; the rest of the indentation is the line's own
(traceback frames keep theirs). The scanner (core/diagnose/scan.py), the metrics parser and the
live agent (through the scanner) all call `normalize`; `rejoin` glues terminal-wrapped lines
back together for readers that get a pasted excerpt whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")

# -- one pattern per layer, each anchored at the start of what is left ---------------------
_ISO = re.compile(
    r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"
    r"(?: *\|)? ?"
)
_CLOCK = re.compile(r"\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?(?: *\|)? (?=\S)")
_GLOG = re.compile(r"\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s\]]+:\d+\] ?")
_GLOG_SHORT = re.compile(
    r"\[[IWEF](?:\d{3,4} \d\d:\d\d:\d\d\.\d+ )?[\w./-]+\.(?:cpp|cc|h|py):\d+\] ?"
)
_PYLOG = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:(?: ?\[\w+\])? ?")
_PYLOG2 = re.compile(r"[\w.]+: \[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ")
_DSLOG = re.compile(
    r"\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?::[\w.]+)?\] ?(?:\[[\w.]+:\d+:\w+\] )?"
)
_LEVEL = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|WARN) *(?:\||:|-)? +(?=\S)")
_DASH_LEVEL = re.compile(
    r"[-|] (?:[\w.]+ [-|] )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|SUCCESS) *"
    r"[-|] ?"
)
# vLLM / Ray workers: `ERROR 04-15 00:31:11 worker_base.py:574] `
_VLLM = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] ?")
_RANK = re.compile(
    r"\[(?:default|rank) ?(\d+)\]:? ?|\[1,(\d+)\]<std(?:out|err)>: ?|\[(\d+)\] (?=\S)"
)
_TORCHX = re.compile(r"\[[A-Za-z_][\w-]*?\d*\|(\d+)\]: ?")
_DETERMINED = re.compile(r"(?:[0-9a-f]{8} )?\[rank=(\d+)\] \|\| ?|[0-9a-f]{8} \|\| ?")
_SRUN = re.compile(r" ?(\d{1,4}): (?=\S|\s)")
_RAY = re.compile(r"\((?:[\w-]+ )?pid=\d+(?:, ip=[\d.]+)?\) ?")
_KUBECTL = re.compile(r"\[pod/([\w.-]+)/[\w.-]+\] ?")
_COMPOSE = re.compile(r"([a-z][\w.-]*?-\d+) +\| ?")
# pdsh / DeepSpeed's multi-node runner: `worker-1: ...`. A host name, not an exception type
# (`RuntimeError: ...`) nor a word (`Epoch: 1`): lower case, and a digit, dash or dot in it.
_HOST = re.compile(r"(localhost|[a-z][a-z0-9]*(?:[-.][a-z0-9]+)+|[a-z]+\d+[a-z0-9]*): (?=\S|\s)")
_NOT_HOSTS = frozenset(
    (
        "step",
        "iter",
        "epoch",
        "loss",
        "error",
        "warning",
        "note",
        "info",
        "http",
        "https",
        "file",
        "cuda",
        "nccl",
    )
)
_TMUX_STATUS = re.compile(r"^\[[\w.-]+\] \d+:[\w.~/-]+[*\-#!~Z]? .*\"[^\"]*\" \d\d:\d\d")
_TMUX_POS = re.compile(r"\s*\[\d+/\d+\]\s*$")
_BOX_TOP = re.compile(r"^\s*[╭┌+][─━-]+ *(.*?) *[─━-]+[╮┐+]\s*$")
_BOX_BOTTOM = re.compile(r"^\s*[╰└+][─━-]+[╯┘+]\s*$")
_BOX_ROW = re.compile(r"^\s*[│┃|] ?(.*?) *[│┃|]\s*$")


@dataclass
class Norm:
    text: str  # the message
    rank: int | None = None  # from [rankN]: / [defaultN]: / srun N: / [rank=N] ||
    host: str | None = None  # from pdsh / compose / kubectl prefixes
    stamped: bool = False  # a time stamp was among the prefixes
    boxed: bool = False  # inside a rich box (a frame line of a rich traceback)


def normalize(line: str) -> Norm:
    """The message of one physical line and what its prefixes said."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    s = line.rstrip("\r\n")
    if not s:
        return Norm("")
    c = s[0]
    # the common case, a line with no prefix: no pattern is tried
    if c not in "[(0123456789IWEFDCabcdefghijklmnopqrstuvwxyz│┃╭╰┌└+ ->" and c != "|":
        return Norm(s)
    out = Norm(s)
    for _ in range(8):  # layers nest; each pass strips one
        before = s
        s = _strip_one(s, out)
        if s == before:
            break
    out.text = s
    return out


def _strip_one(s: str, out: Norm) -> str:
    c = s[:1]
    if not c:
        return s
    if c == ">" and s[1:2] in (" ", ">", ""):  # a markdown quote (a log pasted in an issue)
        return s[2:] if s[1:2] == " " else s[1:]
    if c in "│┃╭╰┌└" or (c == " " and s.lstrip()[:1] in "│┃╭╰"):
        return _unbox(s, out)
    if c == "[":
        m = _RANK.match(s)
        if m:  # torchrun's [rankN]: / [defaultN]:, Open MPI's --tag-output, mpirun's [N]
            n = int(m.group(1) or m.group(2) or m.group(3))
            # a bare `[N] ` is as often a log viewer's line number: large ones are not ranks
            if m.group(3) is None or n < 256:
                out.rank = n
            return s[m.end() :]
        for rx in (_ISO, _CLOCK, _GLOG, _GLOG_SHORT, _DSLOG):
            m = rx.match(s)
            if m:
                if rx is _ISO or rx is _CLOCK or rx is _GLOG:
                    out.stamped = True
                return s[m.end() :]
        m = _TORCHX.match(s)
        if m:
            out.rank = int(m.group(1))
            return s[m.end() :]
        m = _KUBECTL.match(s)
        if m:
            out.host = m.group(1)
            return s[m.end() :]
        m = _DETERMINED.match(s)
        if m:
            if m.group(1):
                out.rank = int(m.group(1))
            return s[m.end() :]
        if _TMUX_STATUS.match(s):
            return ""
        return s
    if c.isdigit():
        m = _ISO.match(s) or _CLOCK.match(s)
        if m:
            out.stamped = True
            return s[m.end() :]
        m = _DETERMINED.match(s)
        if m:
            if m.group(1):
                out.rank = int(m.group(1))
            return s[m.end() :]
        m = _SRUN.match(s)
        if m and out.rank is None:
            out.rank = int(m.group(1))
            return s[m.end() :]
        return s
    if c in "IWEF":
        m = _GLOG.match(s)
        if m:
            out.stamped = True
            return s[m.end() :]
    if c in "DIWEC":
        m = _VLLM.match(s) or _PYLOG.match(s) or _LEVEL.match(s)
        if m:
            return s[m.end() :]
    if c in "-|":
        m = _DASH_LEVEL.match(s)
        return s[m.end() :] if m else s
    if c == "(":
        m = _RAY.match(s)
        return s[m.end() :] if m else s
    if c == " " and s[1:2].isdigit():
        m = _SRUN.match(s)
        if m and out.rank is None:
            out.rank = int(m.group(1))
            return s[m.end() :]
        return s
    if "a" <= c <= "z":
        m = _DETERMINED.match(s)
        if m:
            if m.group(1):
                out.rank = int(m.group(1))
            return s[m.end() :]
        m = _PYLOG2.match(s)  # `torch.distributed...api: [ERROR] `: a logger, not a host
        if m:
            return s[m.end() :]
        m = _COMPOSE.match(s)
        if m and out.host is None:
            out.host = m.group(1)
            return s[m.end() :]
        m = _HOST.match(s)
        if m and out.host is None and m.group(1) not in _NOT_HOSTS:
            out.host = m.group(1)
            return s[m.end() :]
    return s


def _unbox(s: str, out: Norm) -> str:
    """A rich panel: the top border names the panel (`Traceback (most recent call last)`),
    rows are its content, indented like a traceback's frames so the traceback reader keeps
    them; the bottom border ends nothing by itself (the exception line after it does)."""
    m = _BOX_TOP.match(s)
    if m:
        title = m.group(1)
        return title + (":" if title.startswith("Traceback") and not title.endswith(":") else "")
    if _BOX_BOTTOM.match(s):
        out.boxed = True
        return "  "
    m = _BOX_ROW.match(s)
    if m:
        out.boxed = True
        return "  " + m.group(1) if m.group(1).strip() else "  "
    if s.lstrip()[:1] in "│┃":  # a row cut at its right border
        out.boxed = True
        return "  " + s.lstrip()[1:].strip()
    return s


def strip(line: str) -> str:
    """Only the message."""
    return normalize(line).text


# -- terminal-wrapped lines ----------------------------------------------------------------

# lines that start something of their own: indentation, a traceback's parts, a rule line
# (torchrun's ====/----), a bracketed prefix, torchrun's table headings
_NEW_LINE = re.compile(
    r"^(?:\s|Traceback|File |During handling|The above exception|\[|Root Cause"
    r"|Failures:|(.)\1{9,}$|$)"
)


def rejoin(lines: list[str], width: int | None = None) -> list[str]:
    """Lines a terminal or a web page hard-wrapped at a fixed width, joined back.

    A line is taken as cut when it is exactly as long as the widest line of the excerpt (the
    wrap width; at least 60 columns) and the next one does not start a new line of its own
    (no prefix of its own, not indented, not a traceback's own line)."""
    if not lines:
        return lines
    w = width or max(len(x) for x in lines)
    if w < 60:
        return list(lines)
    full = {x for x in lines if len(x) == w}
    if len(full) < 2 and width is None:
        return list(lines)  # no fixed width: nothing was wrapped
    out: list[str] = []
    for x in lines:
        # lines of one shape (records printed alike) are not a line and its continuation
        if (
            out
            and len(out[-1]) % w == 0
            and not _NEW_LINE.match(x)
            and x[:2] != out[-1][:2]
            and normalize(x).text == x
        ):
            out[-1] += x
        else:
            out.append(x)
    return out
