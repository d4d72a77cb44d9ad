"""The hardware pane: per GPU utilisation, memory, power and temperature as bars, each with a
strip of the whole run (run.db's telemetry tiers, downsampled by the watcher); on a host
without NVML (the CPU demo) each rank's CPU % and RSS, with the same strips, so a starved
or stuck rank shows there too. Laid out for the width it gets: one line of bars per GPU and
one line of strips under it. A multi-node run's other nodes follow node 0, each under a
header naming its number, host and ranks, from the newest sample the head holds for it
(core's `node_telemetry`: no strips), or a line saying the head holds none."""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.text import Text
from textual.widget import Widget

from tunedeck.tui.widgets.fit import relayout
from tunedeck.tui.widgets.panes import colour_bar, fmt_mib, strip

# Board power when NVML gives no limit (it is not sampled): the bar's full scale.
POWER_W = (
    ("H200", 700),
    ("H100", 700),
    ("H20", 500),
    ("B200", 1000),
    ("GB200", 1200),
    ("A100", 400),
    ("A800", 400),
    ("L40", 350),
    ("A6000", 300),
    ("L4", 72),
    ("4090", 450),
    ("3090", 350),
)
TEMP_MAX_C = 100.0


def power_scale(name: str | None, seen: float | None) -> float:
    for key, watts in POWER_W:
        if name and key in name:
            return float(max(watts, seen or 0))
    return float(max(300.0, seen or 0))


def _series(history: dict | None, kind: str, k: int, metric: str) -> list:
    try:
        return history[kind]["series"][k][metric]
    except (KeyError, TypeError):
        try:  # JSON keys come back as strings from some callers
            return history[kind]["series"][str(k)][metric]
        except (KeyError, TypeError):
            return []


COMPACT = 70  # below this width: numbers without bars, a strip under each line


def hardware_text(
    tel: dict[str, Any],
    history: dict | None,
    host: str | None,
    width: int,
    nodes: list[dict[str, Any]] | None = None,
    now: float | None = None,
) -> Text:
    """`tel`, `history`, `host`: this machine's node (the head, node 0). `nodes`: the node
    rows of a multi-node run (core's node view, each other node's newest sample as
    `telemetry`), rendered after node 0, each under its own header; a node the head holds
    no telemetry for says so (with its link's state) instead of vanishing."""
    width = max(width, 24)
    others = [n for n in nodes or [] if n.get("node")]
    if others:  # every node is named by its number and host, node 0 first
        head = next((n for n in nodes or [] if n.get("node") == 0), {})
        label = f"node 0 {head.get('host') or host or ''}".rstrip()
    else:
        label = f"node {host or '?'}"
    out = _node_lines(tel, history, label, width, strips=True)
    if not out:
        out = ["[dim]no telemetry yet (the agent samples once the ranks run)[/dim]"]
        if others:
            out[0] = f"[b]{escape(label)}[/b] · " + out[0]
    now = time.time() if now is None else now
    for n in others[: FULL_NODES - 1]:
        out += _other_node(n, width, now)
    rest = others[FULL_NODES - 1 :]
    if rest:  # a line per node past the first ones: 128 nodes of 8 GPUs drawn in full
        # take ~200 ms of the UI thread per frame, as lines ~5 ms
        out.append(
            f"[dim]nodes {rest[0].get('node')}-{rest[-1].get('node')}, a line each: the "
            "mean of its GPUs (the least busy one's utilisation), its ranks alive[/dim]"
        )
        out += [_node_summary(n, now) for n in rest]
    kind = "gpu" if tel.get("gpus") else "rank"
    res = ((history or {}).get(kind) or {}).get("step_s")
    if res and tel:
        whose = "node 0's whole run" if others else "the whole run"
        out.append(f"[dim]strips: {whose}, {res:.0f} s a cell at most[/dim]")
    return Text.from_markup("\n".join(out))


STALE_S = 30.0  # a node's newest sample older than this: its age is shown (2 s a sample)
FULL_NODES = 8  # nodes drawn in full (node 0 first); the others a line each


def _mean(values: list) -> float | None:
    nums = [v for v in values if isinstance(v, (int, float))]
    return sum(nums) / len(nums) if nums else None


def _node_summary(n: dict[str, Any], now: float) -> str:
    """One line for a node past the first FULL_NODES: its ranks, its GPUs' mean utilisation
    and memory with the least busy GPU's utilisation, or its ranks' CPU without NVML, and
    how many of its ranks' processes its newest sample saw."""
    ranks = list(n.get("ranks") or [])
    label = f"node {n.get('node')} {n.get('host') or ''}".rstrip()
    tel = n.get("telemetry") or {}
    head = f"[b]{escape(label)}[/b] · {_ranks_text(ranks)}"
    if not set(tel) - {"t", "node"}:
        return head + f" · [yellow]no telemetry from this node on the head[/] ({_why(n)})"
    gpus = tel.get("gpus") or []
    alive = len((tel.get("procs") or {}).get("ranks") or [])
    if gpus:
        utils = [g.get("util") for g in gpus]
        low = min((u for u in utils if isinstance(u, (int, float))), default=None)
        part = (
            f"{len(gpus)} GPUs util {_num(_mean(utils), '.0f', 1)}% "
            f"(min {_num(low, '.0f', 1)}%) mem {fmt_mib(_mean([g.get('mem_used_mib') for g in gpus]))}"
            f"/{fmt_mib(_mean([g.get('mem_total_mib') for g in gpus]))}"
        )
    else:
        cpus = [r.get("cpu_pct") for r in (tel.get("procs") or {}).get("ranks") or []]
        part = f"no GPU telemetry · rank cpu {_num(_mean(cpus), '.0f', 1)}%"
    line = f"{head} · {part} · {alive}/{len(ranks)} ranks alive"
    age = stale_age(n, now)
    if age:
        line += f" · [yellow]sample {age} old[/]"
    return line


def _why(n: dict[str, Any]) -> str:
    """Why the head holds no telemetry for a node, from its link's state."""
    reach = str(n.get("reach") or "-")
    return escape(
        {
            "connected": "none received yet",
            "shared fs": "none written yet",
            "not started by tunedeck": "not started by tunedeck",
            "waiting for Slurm": "Slurm has not started it yet",
            "never started": "Slurm never started it",
        }.get(reach, f"link {reach}")
    )


def _ranks_text(ranks: list) -> str:
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {ranks[0]}-{ranks[-1]}"


def _other_node(n: dict[str, Any], width: int, now: float) -> list[str]:
    """One other node: its newest sample as node 0's is drawn (no strips: the head holds its
    history only as single samples), or a line saying the head holds none and why."""
    k, ranks = n.get("node"), list(n.get("ranks") or [])
    label = f"node {k} {n.get('host') or ''}".rstrip()  # Slurm's: known once it runs
    tel = n.get("telemetry") or {}
    lines = _node_lines(
        tel, None, label, width, strips=False, expected=ranks, sub=f" · {_ranks_text(ranks)}"
    )
    reach = str(n.get("reach") or "-")
    if not lines:
        return [
            f"[b]{escape(label)}[/b] · {_ranks_text(ranks)} · "
            f"[yellow]no telemetry from this node on the head[/] ({_why(n)})"
        ]
    age = stale_age(n, now)
    if age:
        lines[0] += f" · [yellow]sample {age} old[/] (link {escape(reach)})"
    return lines


def stale_age(n: dict[str, Any], now: float) -> str:
    """How old a node's newest sample is, when older than STALE_S ("" when fresh or none)."""
    t = (n.get("telemetry") or {}).get("t")
    if not isinstance(t, (int, float)) or now - t <= STALE_S:
        return ""
    s = now - t
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h"


def _node_lines(
    tel: dict[str, Any],
    history: dict | None,
    label: str,
    width: int,
    strips: bool,
    expected: list | None = None,
    sub: str = "",
) -> list[str]:
    """One node's block: a header (`label` in bold, then `sub`), a line per GPU (labelled
    with its rank), the rank processes (every rank without NVML), the host line; [] when
    `tel` holds nothing."""
    if not tel or not set(tel) - {"t", "node"}:
        return []
    status = tel.get("status") or {}
    gpus = tel.get("gpus") or []
    names = status.get("gpus") or []
    out: list[str] = []
    if gpus:
        model = names[0] if names else "GPU"
        head = f"[b]{escape(label)}[/b]{sub} · {len(gpus)}× {escape(model)}"
        if status.get("driver") and width >= COMPACT:
            head += f" · driver {escape(str(status['driver']))}"
        out.append(head)
        rank_of = {}
        for gp in (tel.get("procs") or {}).get("gpu_procs") or []:
            if gp.get("rank") is not None:
                rank_of.setdefault(gp["gpu"], gp["rank"])
        for g in gpus:
            out += _gpu_lines(g, names, rank_of, history, width, strips)
    else:
        out.append(f"[b]{escape(label)}[/b]{sub} · no GPU telemetry; per rank:")
    ranks = (tel.get("procs") or {}).get("ranks") or []
    if ranks or not gpus:
        out += _rank_lines(
            ranks, history, width, with_strips=strips and not gpus, expected=expected
        )
    if not gpus:
        why = status.get("message") or status.get("nvml") or "NVML unavailable"
        out.append(f"[dim]NVML: {escape(str(why))}[/dim]")
    h = tel.get("host") or {}
    if h:
        line = (
            f"[dim]host cpu {h.get('cpu_pct', 0):.0f}%  mem "
            f"{fmt_mib(h.get('mem_used_mib'))}/{fmt_mib(h.get('mem_total_mib'))}"
        )
        if h.get("shm_free_mib") is not None:
            line += f"  shm free {fmt_mib(h.get('shm_free_mib'))}"
        out.append(line + "[/dim]")
    return out


def _num(v: Any, fmt: str, width: int) -> str:
    return f"{v:{fmt}}".rjust(width) if isinstance(v, (int, float)) else "-".rjust(width)


def _gpu_lines(
    g: dict, names: list, rank_of: dict, history: dict | None, width: int, strips: bool = True
) -> list[str]:
    i = g.get("gpu", 0)
    name = names[i] if i < len(names) else None
    util, used, total = g.get("util"), g.get("mem_used_mib"), g.get("mem_total_mib")
    power, temp = g.get("power_w"), g.get("temp_c")
    label = f"{f'GPU{i}' + (f' r{rank_of[i]}' if i in rank_of else ''):<8}"
    hot = isinstance(util, (int, float)) and util < 30  # an idle GPU in a running job
    mem_frac = used / total if isinstance(used, (int, float)) and total else None
    nums = [
        f"{_num(util, '.0f', 3)}%",
        f"{fmt_mib(used):>5}/{fmt_mib(total)}",
        f"{_num(power, '.0f', 4)}W",
        f"{_num(temp, '.0f', 3)}°C",
    ]
    if width < COMPACT:
        line1 = f"[b]{label}[/b]" + " ".join(nums)
    else:
        pscale = power_scale(name, power)
        keys = ("util", "mem", "pwr", "tmp")
        # what the four bars leave: label, keys, numbers and the spaces between them
        fixed = len(label) + sum(len(k) + len(n) + 2 for k, n in zip(keys, nums)) + 3
        bw = max(3, min(20, (width - fixed) // 4))
        fr = [
            util / 100 if isinstance(util, (int, float)) else None,
            mem_frac,
            power / pscale if isinstance(power, (int, float)) else None,
            temp / TEMP_MAX_C if isinstance(temp, (int, float)) else None,
        ]
        colours = ("yellow" if hot else "green", "cyan", "magenta", "red")
        line1 = f"[b]{label}[/b]" + " ".join(
            f"{k} {colour_bar(f, bw, c)} {n}" for k, f, n, c in zip(keys, fr, nums, colours)
        )
    if not strips:
        return [line1]
    sw = max(4, (width - len(label) - 12) // 2)
    u = strip(_series(history, "gpu", i, "util"), sw, 100.0)
    m = strip(_series(history, "gpu", i, "mem_used_mib"), sw, total or None)
    line2 = " " * len(label) + f"[{'yellow' if hot else 'green'}]{u}[/] util [cyan]{m}[/] mem"
    return [line1, line2]


def _rank_lines(
    ranks: list[dict],
    history: dict | None,
    width: int,
    with_strips: bool,
    expected: list | None = None,
) -> list[str]:
    """A line per rank process (live: the latest sample), and on hosts without NVML the
    strips of every rank the run's history holds, alive or not; `expected`: the ranks the
    node runs by its plan (another node's), each listed, alive or not."""
    live = {r.get("rank"): r for r in ranks}
    known = sorted(
        set(live)
        | (set(((history or {}).get("rank") or {}).get("series") or {}) if with_strips else set())
        | set(expected or ()),
        key=lambda k: int(k),
    )
    if not known:
        return ["[dim]no rank process alive[/dim]"]
    out = []
    for k in known:
        r = live.get(k)
        label = f"{f'rank {k}':<7}"
        if r is None:
            line = f"[b]{label}[/b] [dim]not running[/dim]"
        else:
            cpu, rss = r.get("cpu_pct"), r.get("rss_mib")
            cpu_s = f"{_num(cpu, '.0f', 4)}%"
            if width >= COMPACT:
                bw = max(4, min(20, width - 48))
                frac = cpu / 100 if isinstance(cpu, (int, float)) else None
                cpu_s = f"{colour_bar(frac, bw, 'green')} {cpu_s}"
            line = f"[b]{label}[/b] cpu {cpu_s} rss {fmt_mib(rss):>5}"
            if r.get("workers"):
                line += (
                    f" +{r['workers']} worker{'s' if r['workers'] > 1 else ''} "
                    f"{r.get('workers_cpu_pct', 0):.0f}%"
                )
        out.append(line)
        if with_strips:
            sw = max(4, (width - len(label) - 10) // 2)
            c = strip(_series(history, "rank", k, "cpu_pct"), sw, None)
            m = strip(_series(history, "rank", k, "rss_mib"), sw, None)
            out.append(" " * len(label) + f"[green]{c}[/] cpu [cyan]{m}[/] rss")
    return out


NODE_KEYS = ("node", "host", "ranks", "reach", "telemetry")


class HardwareView(Widget):
    """Renders the latest sample and the run's strips for the width it has; a new layout
    only when the number of lines changes (the numbers change every refresh)."""

    DEFAULT_CSS = "HardwareView { height: auto; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.telemetry: dict[str, Any] = {}
        self.history: dict | None = None
        self.host: str | None = None
        self.nodes: list[dict[str, Any]] = []  # a multi-node run's nodes, what the pane draws
        self._ages: list[str] = []
        self._text: Text | None = None
        self._width = 0

    def show(
        self,
        telemetry: dict[str, Any],
        history: dict | None,
        host: str | None,
        nodes: list[dict[str, Any]] | None = None,
    ) -> None:
        # of a node row only what the pane draws: its link's timings change every poll
        nodes = [{k: n.get(k) for k in NODE_KEYS} for n in nodes or []]
        now = time.time()
        ages = [stale_age(n, now) for n in nodes]  # a stale sample's age, as it grows
        if (
            telemetry == self.telemetry
            and history is None
            and host == self.host
            and nodes == self.nodes
            and ages == self._ages
        ):
            return
        self._ages = ages
        self.telemetry = telemetry
        if history is not None:
            self.history = history
        self.host = host
        self.nodes = nodes
        lines = len(self._text.plain.splitlines()) if self._text is not None else -1
        self._text = None
        if len(self._render_text().plain.splitlines()) != lines:
            relayout(self)
        else:
            self.refresh()

    def _render_text(self) -> Text:
        width = self.size.width or 80
        if self._text is None or width != self._width:
            self._text, self._width = (
                hardware_text(self.telemetry, self.history, self.host, width, self.nodes),
                width,
            )
        return self._text

    def render(self) -> Text:
        return self._render_text()

    @property
    def text(self) -> str:
        return self._render_text().plain
