"""Compose a run in forms, and see exactly what it will run.

The form is generated from core/spec.py's one declaration of every option (`OPTIONS`: type,
help, choices, min, `when`, `group`): a field per option, in the spec's sections, showing only
the options that apply to the chosen backend, strategy, method and cluster. A value is checked
as it is typed by the check TOML loading and `--set` use (`parse_value`, `cross_checks`), and
the problem is shown under the field, naming the key.

The side pane follows the form: the exact per-node command and environment (secrets masked),
the port the launch will really use (picked once here, kept for the launch), the values the
built-in trainer reads from spec.toml, the effective batch and the memory estimate against each
GPU's capacity (the verdicts preflight's memory check decides from). It is core's `preview`
(the one `tunedeck launch --dry-run` prints), built off the UI thread (`build_preview`) and
rendered (`render_preview`), debounced, and a stale preview is dropped; ms-swift's flag table, which
needs a subprocess once per version, is read in a worker too, never on the UI thread.
"""

from __future__ import annotations

import copy
import re
import shlex
import threading
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static
from textual.worker import get_current_worker

from tunedeck.tui.widgets.fit import FitStatic
from tunedeck.tui.widgets.footer import Footer
from tunedeck.core import api
from tunedeck.core.api import PRESETS_DIR, GpuFacts, pin_port, probe_gpus
from tunedeck.core.spec import (
    GROUPS,
    OPTIONS,
    Option,
    RunSpec,
    SpecError,
    check_option,
    cross_checks,
    get_value,
    is_secret_name,
    is_set,
    mask_env,
    mask_spec,
    parse_value,
    resolve_paths,
    set_values,
)
from tunedeck.tui.screens.base import TunedeckModal, TunedeckScreen
from tunedeck.tui.screens.preflight import fmt_value
from tunedeck.tui.screens.prompt import PromptScreen
from tunedeck.tui.widgets.titlebar import TitleBar

DEBOUNCE_S = 0.03  # edits closer together than this preview once, when they pause
# what the built-in trainer reads from spec.toml (torchrun's flags come from the rest)
TRAINER_TABLES = ("model", "data", "method", "train", "parallel")
TRAINER_KEYS = ("cluster.device", "cluster.dist_backend", "cluster.collective_timeout_s")
# keys other options' applicability depends on: editing one re-evaluates what is shown
DRIVERS = frozenset(k for o in OPTIONS.values() for k in (o.when or {}))
FIT_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red", "skip": "dim"}
_KEY_AT_START = re.compile(r"^(env\.[A-Za-z0-9_]+|[a-z_]+(?:\.[a-z_0-9]+)*)")
# what an empty box of an ms-swift key says until the preview names the value
UNSET_HINT = "unset: ms-swift's default"


def runs_default(spec: RunSpec, key: str) -> bool:
    """Whether `key`'s field stands for ms-swift's own default: an ms-swift spec leaves a key
    with an ms-swift flag unset, so no flag is passed. Its box is empty and shows, dim, the
    value ms-swift will use; emptying a box unsets the key again."""
    return key in api.own_keys(spec.backend) and not is_set(spec, key)


# -- the preview, built in a worker ------------------------------------------------------


@dataclass
class PreviewData:
    facts: Text  # what runs, port, batch, memory against each GPU
    body: Text  # per-node commands and environment, the trainer's values
    fit: str  # pass | warn | fail | skip: the estimate against the GPUs
    error: str = ""  # why there is no plan
    estimate: Any = None  # SpecEstimate, or why there is none (str)
    gpu_mem_gib: float | None = None
    gpu_count: int = 0
    # key -> the value ms-swift runs with for a key the spec leaves unset (dim in its box)
    hints: dict[str, str] = field(default_factory=dict)


def build_preview(spec: RunSpec, facts: GpuFacts, port: int | None = None) -> PreviewData:
    """Everything the side pane shows for `spec` on `facts`: core's `preview` (the dry run's
    too), rendered. `port`: the one this form keeps for cluster.master_port = 0."""
    try:
        p = api.preview(spec, facts, port=port)
    except Exception as e:  # noqa: BLE001 - ValueError naming the key, FlagTableError...
        msg = str(e)
        return PreviewData(Text(""), Text(msg, style="red"), "skip", msg or type(e).__name__)
    return render_preview(p)


def render_preview(p) -> PreviewData:
    """A core `Preview` as the side pane shows it."""
    resolved, c = p.spec, p.spec.cluster
    facts_t = Text()
    facts_t.append(f"{resolved.backend} · ", style="bold")
    fp8 = (
        " (frozen base in fp8)"
        if getattr(p.estimate, "inputs", None) and p.estimate.inputs.fp8_base
        else ""
    )
    facts_t.append(
        f"{resolved.method.type}{fp8} on {resolved.model.path} · {c.nnodes} node(s) × "
        f"{c.nproc_per_node} {c.device} rank(s) · {c.dist_backend} · "
        f"{resolved.parallel.strategy}\n"
    )
    facts_t.append(f"port {p.port}", style="bold")
    kept = "; the launch keeps it" if p.port_picked else ""
    facts_t.append(f" ({p.port_note}{kept})\n", style="dim")
    # the batch and the memory of the run it starts (ms-swift's defaults where unset), the
    # numbers preflight and `tunedeck estimate` give for the same spec
    facts_t.append(p.batch + "\n")
    if isinstance(p.estimate, str):
        facts_t.append(p.memory_line + "\n", style="dim")
    else:
        if c.device != "cuda":
            facts_t.append(p.memory_line + "\n")
        else:
            head, _, tail = p.memory_line.partition(" (")
            facts_t.append(head, style=FIT_STYLE[p.fit])
            facts_t.append(f" ({tail}\n", style="dim")
        for line, status in p.gpu_lines:  # one verdict per GPU, preflight's own
            facts_t.append(f"  {line}\n", style=FIT_STYLE[status])
        facts_t.append("ctrl+t: the advisor's suggestion\n", style="dim")

    body = Text()
    for node in p.plan.nodes:
        body.append(f"── node {node.node_rank} · {node.host} ──\n", style="bold")
        # launch.sh as a launch writes it (secrets masked), less the shell's preamble
        lines = p.plan.to_shell(node.node_rank).splitlines()
        body.append(
            "\n".join(x for x in lines if not x.startswith(("#!", "set -", "# tunedeck"))) + "\n"
        )
    body.append("run id and run directory are named at launch\n", style="dim")
    for warning in p.warnings:  # a credential flag the backend cannot move into the environment
        body.append(warning + "\n", style="bold yellow")
    if api.reads_spec_toml(resolved.backend):
        body.append("── the trainer reads from spec.toml ──\n", style="bold")
        for o in OPTIONS.values():
            table = o.key.split(".")[0]
            if (table in TRAINER_TABLES or o.key in TRAINER_KEYS) and o.applies(resolved):
                value = get_value(resolved, o.key)
                shown = (
                    "[" + ", ".join(map(fmt_value, value)) + "]"
                    if isinstance(value, list)
                    else fmt_value(value)
                )
                body.append(f"{o.key} = ", style="dim")
                body.append(shown + "\n", style="bold" if value != o.default else "")
    if p.settings:
        # what ms-swift will use for each setting tunedeck has a key for, and whose it is:
        # the spec's (a flag in the command), extra_args', or ms-swift's own default (no flag)
        body.append("── ms-swift settings: value (from) ──\n", style="bold")
        for r in p.settings:
            own = api.is_default(r)
            body.append(f"--{r['flag']} ", style="dim")
            body.append(api.setting_value(r), style="" if own else "bold")
            body.append(f"  ({r['key']}: {r['source']})\n", style="dim" if own else "")
    hints = {
        r["key"]: f"{api.setting_value(r)} · {r['source']}" for r in p.settings if api.is_default(r)
    }
    mem = min((g.gpu.memory_total_gib for g in p.gpus), default=None)
    return PreviewData(facts_t, body, p.fit, "", p.estimate, mem, len(p.gpus), hints)


# -- form fields --------------------------------------------------------------------------


def render_lengths(rep, why: str) -> Text:
    """The token-length section of the side pane: the sample's histogram, percentiles, what
    data.max_length cuts, and the advice (core/estimate/lengths.py)."""
    t = Text("\ntoken lengths", style="bold")
    t.append(" (a sample of data.path, the model's tokenizer)\n", style="dim")
    if rep is None:
        t.append(why + "\n", style="dim")
        return t
    t.append(rep.summary() + "\n")
    for line in rep.bars(24):
        t.append(line + "\n", style="red" if int(line[1:8]) > rep.max_length else "")
    advice = rep.advice()
    if advice:
        t.append(f"consider {advice}\n", style="yellow")
    return t


def _word(w: str) -> str:
    """A word as shlex.split reads it back, quoted only when it must be (`****` stays)."""
    return shlex.quote(w) if not w or re.search(r"[\s'\"\\#]", w) else w


def field_text(o: Option, value: Any) -> str:
    """A value as its text field shows it (parse_value reads it back)."""
    origin = typing.get_origin(o.type)
    if origin is list:
        return " ".join(map(_word, value))
    if origin is dict:
        return " ".join(_word(f"{k}={v}") for k, v in mask_env(value).items())
    if o.type is float:
        return repr(value)
    return str(value)


def widget_id(key: str) -> str:
    return "w-" + key.replace(".", "--")


class FieldRow(Widget):
    """One option: its dotted key, its input, and the problem with it (hidden when none)."""

    DEFAULT_CSS = """
    FieldRow {
        height: auto; layout: grid; grid-size: 2; grid-columns: 30 1fr; grid-rows: auto;
    }
    FieldRow .field-key { width: 30; color: $text-muted; }
    FieldRow.-changed .field-key { color: $text; text-style: bold; }
    FieldRow Input, FieldRow Select { width: 1fr; }
    FieldRow .field-error {
        display: none; color: $error; padding-left: 30; height: auto; column-span: 2;
    }
    FieldRow.-error .field-error { display: block; }
    FieldRow.-error .field-key { color: $error; }
    """

    def __init__(self, option: Option, spec: RunSpec):
        super().__init__(id="f-" + option.key.replace(".", "--"))
        self.option = option
        self.value = get_value(spec, option.key)
        self.unset = runs_default(spec, option.key)
        self.hint = UNSET_HINT  # the value ms-swift uses, once a preview has named it
        self.problem = ""

    def compose(self) -> ComposeResult:
        # a two-column grid, not a row container: one widget fewer for each of ~100 fields
        o = self.option
        yield Label(o.key, classes="field-key")
        wid = widget_id(o.key)
        # an ms-swift key may be left unset: blank, ms-swift's value shown dim instead
        blank_ok = o.key in api.own_keys()
        if o.choices or o.type is bool:
            # a bool is a choice too: "true"/"false" reads where a box's colour would not
            choices = (
                [(str(c), c) for c in o.choices]
                if o.choices
                else [("false", False), ("true", True)]
            )
            value = o.type(self.value) if o.type is bool else self.value
            yield Select(
                choices,
                value=Select.NULL if self.unset else value,
                allow_blank=blank_ok,
                prompt=self.hint,
                compact=True,
                id=wid,
            )
        else:
            # the hint only in an unset box: an empty value elsewhere is a value
            yield Input(
                "" if self.unset else field_text(o, self.value),
                compact=True,
                id=wid,
                select_on_focus=False,
                placeholder=self.hint if self.unset else "",
            )
        yield Static("", classes="field-error", markup=False)

    def set_problem(self, text: str) -> None:
        if text == self.problem:
            return  # every keystroke re-checks every field: touch only what changed
        self.problem = text
        self.set_class(bool(text), "-error")
        self.query_one(".field-error", Static).update(text)

    def show(self, value: Any, unset: bool = False) -> None:
        """Put `value` in the input (a preset, a fix, the advisor), or nothing for an ms-swift
        key left `unset`; its Changed event then finds nothing to change."""
        self.unset = unset
        w = self.query_one("#" + widget_id(self.option.key))
        if isinstance(w, Input):
            w.placeholder = self.hint if unset else ""
            text = "" if unset else field_text(self.option, value)
            if w.value != text:
                w.value = text
                # the cursor at the end, as after typing it (not where the old text left it:
                # ctrl+u would then keep the tail of the new value)
                w.cursor_position = len(text)
        else:
            value = Select.NULL if unset else value
            if w.value != value:
                w.value = value
        self.set_class(not unset and value != self.option.default, "-changed")

    def set_hint(self, text: str) -> None:
        """What an empty box says: the value ms-swift will use for this unset key."""
        self.hint = text
        w = self.query_one("#" + widget_id(self.option.key))
        if isinstance(w, Input):
            want = text if self.unset else ""
            if w.placeholder != want:
                w.placeholder = want
        elif w.prompt != text:
            w.prompt = text


# -- messages ------------------------------------------------------------------------------


class PreviewStatus(Message):
    def __init__(self, generation: int, text: str):
        super().__init__()
        self.generation = generation
        self.text = text


class PreviewReady(Message):
    def __init__(self, generation: int, started: float, data: PreviewData):
        super().__init__()
        self.generation = generation
        self.started = started
        self.data = data


class SpecLoaded(Message):
    def __init__(self, spec: RunSpec | None, path: Path, error: str = ""):
        super().__init__()
        self.spec = spec
        self.path = path
        self.error = error


class Saved(Message):
    def __init__(self, path: Path, error: str = "", note: str = ""):
        super().__init__()
        self.path = path
        self.error = error
        self.note = note


class SaveExists(Message):
    """The save's target is there already: the user is asked before it is replaced."""

    def __init__(self, path: Path, spec: RunSpec, shipped: bool):
        super().__init__()
        self.path = path
        self.spec = spec
        self.shipped = shipped


class AdviceReady(Message):
    def __init__(self, text: Text, overrides: dict[str, Any], error: str = ""):
        super().__init__()
        self.text = text
        self.overrides = overrides
        self.error = error


# -- dialogs -------------------------------------------------------------------------------


class AdviceScreen(TunedeckModal):
    """The advisor's strategy for this spec on these GPUs; `a` puts its values in the form."""

    BINDINGS = [Binding("a", "apply", "Apply"), Binding("escape,q", "close", "Close")]
    DEFAULT_CSS = """
    AdviceScreen { align: center middle; }
    AdviceScreen > VerticalScroll {
        width: 90%; max-width: 100; height: auto; max-height: 90%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    """

    def __init__(self, text: Text, can_apply: bool):
        super().__init__()
        self.text = text
        self.can_apply = can_apply

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.text, id="advice-text")
            yield Static(
                "a puts these values in the form · esc closes" if self.can_apply else "esc closes",
                classes="dim",
            )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply" and not self.can_apply:
            return False
        return super().check_action(action, parameters)

    def action_apply(self) -> None:
        self.dismiss(True)

    def action_close(self) -> None:
        self.dismiss(False)


# -- the screen ------------------------------------------------------------------------------


class ComposeScreen(TunedeckScreen):
    HELP = (
        "A run as a form: every option of the spec, only those that apply to the chosen "
        "backend and strategy. A bad value shows its problem under the field. The side "
        "pane is what the launch will run: each node's command and environment (secrets "
        "masked), the port, the trainer's values, the effective batch and the memory "
        "estimate per GPU. ctrl+l checks the spec (preflight) and launches it from there; "
        "ctrl+s saves it as a TOML file anywhere; ctrl+o starts from a preset."
    )
    MUTATING = frozenset({"launch", "save"})
    BINDINGS = [
        Binding("ctrl+l", "launch", "Launch"),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "preset", "Preset"),
        Binding("ctrl+t", "advice", "Advice"),
        Binding("ctrl+g", "goto", "Go to field"),
        Binding("escape", "back", "Back"),
        Binding("down", "app.focus_next", "Next field", show=False),
        Binding("up", "app.focus_previous", "Previous field", show=False),
    ]
    DEFAULT_CSS = """
    ComposeScreen #compose-body { layout: horizontal; height: 1fr; }
    ComposeScreen.-narrow #compose-body { layout: vertical; }
    ComposeScreen #form { width: 1fr; height: 1fr; padding: 0 1; }
    ComposeScreen #side { width: 1fr; height: 1fr; border-left: solid $panel; }
    ComposeScreen.-narrow #side { width: 1fr; border-left: none; border-top: solid $panel; }
    ComposeScreen #side-facts { height: auto; max-height: 12; padding: 0 1; }
    ComposeScreen #preview-scroll { height: 1fr; padding: 0 1; }
    ComposeScreen .section { text-style: bold; color: $accent; margin-top: 1; }
    ComposeScreen #form-problems { color: $error; height: auto; }
    ComposeScreen #field-help { height: 1; padding: 0 1; background: $boost; color: $text-muted; }
    """
    NARROW = 120  # below this many columns the preview goes under the form
    # Textual's default would focus the form's scroll container first, then our name field:
    # each focus change restyles the focused widget's whole subtree (the form's 700 widgets,
    # 0.3 s each on a 2-core machine)
    AUTO_FOCUS = "#" + widget_id("name")
    # where GPU facts come from; tests put recorded facts here
    gpu_probe: Callable[[], GpuFacts] = staticmethod(lambda: probe_gpus(topology=False))

    def __init__(self, spec: RunSpec | None = None, path: Path | None = None, title: str = ""):
        super().__init__()
        self.path = Path(path) if path else None
        # a path without a spec: the file is read in a worker once mounted
        self._load_path = self.path if spec is None and self.path else None
        self._pick_preset = spec is None and self.path is None
        self.spec = copy.deepcopy(spec) if spec is not None else RunSpec()
        self.heading = title
        self.field_errors: dict[str, str] = {}  # key -> problem of the text typed there
        self.problems: list[str] = []  # cross-key rules broken (cross_checks)
        self.dirty = False
        # a spec handed in without a file (an imported command, a clone) exists nowhere else
        # until it is saved: leaving it asks, as an edit does
        self.unsaved = spec is not None and self.path is None
        self.port: int | None = None  # picked once, kept for the launch
        self.generation = 0  # of the newest preview asked for
        self.shown_generation = 0  # of the preview on screen
        self.preview: PreviewData | None = None
        self.latencies: list[float] = []  # edit -> preview shown, seconds
        self._edit_started = time.perf_counter()
        self._last_start = 0.0  # when the newest preview was started
        self._timer = None
        self._rows: list[FieldRow] = []
        self._secrets: dict[str, str] = {}  # real values of env secrets shown ****
        self._facts: GpuFacts | None = None
        self._facts_lock = threading.Lock()

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TitleBar(self._title_text())
        with Horizontal(id="compose-body"):
            with VerticalScroll(id="form"):
                yield FitStatic("", id="form-problems", markup=False)
                for gid, title in GROUPS:
                    opts = [o for o in OPTIONS.values() if o.group == gid]
                    if not opts:
                        continue
                    yield Static(title, classes="section", id=f"s-{gid}")
                    for o in opts:
                        yield FieldRow(o, self.spec)
            with Vertical(id="side"):
                yield FitStatic(Text("building the preview…", style="dim"), id="side-facts")
                with VerticalScroll(id="preview-scroll"):
                    yield Static("", id="preview")
        yield Static("", id="field-help", markup=False)
        yield Footer()

    def _title_text(self) -> str:
        name = self.heading or (self.path.name if self.path else "") or self.spec.name
        return f"compose · {name}"

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < self.NARROW, "-narrow")
        self._sync_form()
        self.query_one("#" + widget_id("name")).focus()
        if self._load_path is not None:
            self._read_spec(self._load_path)
        elif self._pick_preset:
            self.call_after_refresh(self.action_preset)

    def on_resize(self) -> None:
        self.set_class(self.size.width < self.NARROW, "-narrow")

    # -- the form -----------------------------------------------------------------------------
    def rows(self) -> list[FieldRow]:
        if not self._rows:
            self._rows = list(self.query(FieldRow))
        return self._rows

    def row(self, key: str) -> FieldRow:
        return self.query_one("#f-" + key.replace(".", "--"), FieldRow)

    def _sync_form(self) -> None:
        """Every field shows self.spec; visibility, problems and the preview follow."""
        self._secrets.update(
            {k: v for k, v in self.spec.env.items() if is_secret_name(k) and set(v) - {"*"}}
        )
        for r in self.rows():
            r.show(get_value(self.spec, r.option.key), runs_default(self.spec, r.option.key))
        self.field_errors.clear()
        self._apply_visibility()
        self._check()
        self.query_one(TitleBar).update(TitleBar._text(self._title_text()))
        self._schedule_preview()

    def _apply_visibility(self) -> None:
        shown: dict[str, bool] = {}
        for r in self.rows():
            want = r.option.applies(self.spec)
            if r.display != want:
                r.display = want
            shown[r.option.group] = shown.get(r.option.group, False) or want
        for gid, _ in GROUPS:
            for s in self.query(f"#s-{gid}"):
                if s.display != shown.get(gid, False):
                    s.display = shown.get(gid, False)

    def _check(self) -> None:
        """Problems under the fields they name: the typed text's, then the cross-key rules'."""
        self.problems = cross_checks(self.spec)
        by_key: dict[str, list[str]] = {}
        loose: list[str] = []
        for p in self.problems:
            m = _KEY_AT_START.match(p)
            key = m.group(1) if m else ""
            key = "env" if key.startswith("env.") else key
            if key in OPTIONS:
                by_key.setdefault(key, []).append(p)
            else:
                loose.append(p)
        for r in self.rows():
            k = r.option.key
            msgs = ([self.field_errors[k]] if k in self.field_errors else []) + by_key.get(k, [])
            r.set_problem("\n".join(msgs))
            if msgs and not r.display:
                loose.extend(msgs)  # a hidden field's problem still shows, at the top
        top = self.query_one("#form-problems", Static)
        if "\n".join(loose) != str(top.content):
            top.update("\n".join(loose))
        if top.display != bool(loose):
            top.display = bool(loose)

    def _edit(self, key: str, raw: Any, typed: bool) -> None:
        started = time.perf_counter()
        if key in api.own_keys(self.spec.backend) and (
            raw is Select.NULL or typed and not raw.strip()
        ):
            self._unset(key, started)
            return
        if raw is Select.NULL:  # the blank choice means nothing on other backends
            self.row(key).show(get_value(self.spec, key))
            return
        value, err = parse_value(key, raw) if typed else check_option(key, raw)
        if err:
            self.field_errors[key] = err
        else:
            self.field_errors.pop(key, None)
            if key == "env":
                value = self._keep_secrets(value)
            # typing the value the key already holds still sets an unset ms-swift key
            if value != get_value(self.spec, key) or runs_default(self.spec, key):
                self.spec = set_values(self.spec, {key: value})
                self.dirty = True
                self.row(key).unset = False
                self.row(key).set_class(value != OPTIONS[key].default, "-changed")
                if key in DRIVERS:
                    self._apply_visibility()
                if key == "backend":  # ms-swift keys not set show empty there, and back
                    for k in api.own_keys():
                        self.row(k).show(get_value(self.spec, k), runs_default(self.spec, k))
        self._check()
        self._schedule_preview(started)

    def _unset(self, key: str, started: float) -> None:
        """An emptied ms-swift field: the key is unset again, so no flag is passed and
        ms-swift's own default applies."""
        self.field_errors.pop(key, None)
        if is_set(self.spec, key):
            spec = set_values(self.spec, {key: OPTIONS[key].default})
            spec.explicit.discard(key)
            self.spec = spec
            self.dirty = True
            row = self.row(key)  # its box is empty already: leave what is typed since
            row.unset = True
            row.set_hint(row.hint)
            row.set_class(False, "-changed")
            if key in DRIVERS:
                self._apply_visibility()
        self._check()
        self._schedule_preview(started)

    def _keep_secrets(self, env: dict[str, str]) -> dict[str, str]:
        """The env field shows secrets as ****: stars (any number, as the field is edited
        keystroke by keystroke) keep the real value; anything else is a new value."""
        out = {}
        for k, v in env.items():
            if is_secret_name(k) and v and not set(v) - {"*"} and k in self._secrets:
                out[k] = self._secrets[k]
            else:
                out[k] = v
                if is_secret_name(k) and set(v) - {"*"}:
                    self._secrets[k] = v
        return out

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        row = self._row_of(event.input)
        if row is not None:
            self._edit(row.option.key, event.value, typed=True)

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        row = self._row_of(event.select)
        if row is not None:
            self._edit(row.option.key, event.value, typed=False)

    def _row_of(self, widget: Widget) -> FieldRow | None:
        for node in widget.ancestors:
            if isinstance(node, FieldRow):
                return node
        return None

    def on_descendant_focus(self, event) -> None:
        row = self._row_of(event.widget)
        if row is None:
            return
        o = row.option
        kind = (
            " | ".join(map(str, o.choices))
            if o.choices
            else getattr(o.type, "__name__", str(o.type)).replace("typing.", "")
        )
        bound = f", ≥ {o.min:g}" if o.min is not None else ""
        # one fixed line (CSS): no layout pass, a whole one on this form of ~700 widgets
        # at every Tab (with Textual's footer's, 681 ms a Tab in a Pilot loop on 2 cores)
        self.query_one("#field-help", Static).update(
            f"{o.key} ({kind}{bound}): {o.help}", layout=False
        )

    def on_descendant_blur(self, event) -> None:
        # a secret typed into the env field is masked again once the cursor leaves it
        if isinstance(event.widget, Input) and event.widget.id == widget_id("env"):
            self.row("env").show(self.spec.env)

    # -- the spec as it will be launched --------------------------------------------------------
    def form_spec(self) -> RunSpec:
        """The form's spec with relative paths from the spec file's folder (or here)."""
        spec = copy.deepcopy(self.spec)
        resolve_paths(spec, self.path.parent if self.path else Path.cwd())
        return spec

    def _pinned(self, spec: RunSpec) -> RunSpec:
        """`spec` with the rendezvous port a launch uses (core's `pin_port`): for
        cluster.master_port = 0 on one node, the port picked once for this form and kept."""
        pinned = pin_port(spec, self.port)
        if pinned is not spec:
            self.port = pinned.cluster.master_port
        return pinned

    def launch_spec(self) -> RunSpec:
        """The form's spec as a launch gets it: its paths resolved and its port pinned."""
        return self._pinned(self.form_spec())

    # -- preview (thread) --------------------------------------------------------------------
    def _schedule_preview(self, started: float | None = None) -> None:
        """Leading and trailing edge: an edit after a quiet spell previews at once; edits
        that follow it within DEBOUNCE_S wait for the typing to pause, then preview once."""
        self.generation += 1
        self._edit_started = started or time.perf_counter()
        if self._timer is not None:
            self._timer.stop()
        elif time.perf_counter() - self._last_start >= DEBOUNCE_S:
            self._start_preview()
            return
        self._timer = self.set_timer(DEBOUNCE_S, self._start_preview)

    def _start_preview(self) -> None:
        self._timer = None
        self._last_start = time.perf_counter()
        spec = self.form_spec()
        self._pinned(spec)  # the preview shows the port the launch will keep
        self._preview(self.generation, self._edit_started, spec, self.port)

    @work(thread=True, exclusive=True, group="compose-preview", exit_on_error=False)
    def _preview(self, generation: int, started: float, spec: RunSpec, port: int | None) -> None:
        worker = get_current_worker()
        facts = self.gpu_facts()
        note = api.warm_note(spec.backend)  # what the backend reads once (ms-swift's flags)
        if note:
            self.post_message(PreviewStatus(generation, note))
        err = api.warm_backend(spec.backend)
        if worker.is_cancelled:
            return  # a newer edit asked for its own preview
        if err:
            data = PreviewData(Text(""), Text(err, style="red"), "skip", err)
        else:
            data = build_preview(spec, facts, port)
            data.body = data.body + render_lengths(*api.length_report(spec))
        if not worker.is_cancelled:
            self.post_message(PreviewReady(generation, started, data))

    @property
    def preview_pending(self) -> bool:
        """An edit whose preview is not on screen yet."""
        return self._timer is not None or self.shown_generation != self.generation

    def gpu_facts(self) -> GpuFacts:
        """This machine's GPUs, probed once per screen (in a worker: NVML can take seconds)."""
        with self._facts_lock:
            if self._facts is None:
                self._facts = type(self).gpu_probe()
            return self._facts

    @on(PreviewStatus)
    def _preview_status(self, msg: PreviewStatus) -> None:
        if msg.generation == self.generation:
            self.query_one("#side-facts", Static).update(Text(msg.text, style="dim"))

    @on(PreviewReady)
    def _preview_ready(self, msg: PreviewReady) -> None:
        if msg.generation != self.generation:
            return  # stale: the form changed since it was asked for
        self.preview = msg.data
        if msg.data.hints:
            for k in api.own_keys():
                self.row(k).set_hint(msg.data.hints.get(k, UNSET_HINT))
        self.query_one("#side-facts", Static).update(self._verdict() + msg.data.facts)
        self.query_one("#preview", Static).update(msg.data.body)
        self.shown_generation = msg.generation
        self.latencies.append(time.perf_counter() - msg.started)

    def _verdict(self) -> Text:
        d = self.preview
        problems = list(self.field_errors.values()) + self.problems
        if problems:
            return Text(f"✗ {len(problems)} problem(s): {problems[0]}\n", style="bold red")
        if d is not None and d.error:
            first = d.error.strip().splitlines()[0] if d.error.strip() else d.error
            return Text(f"✗ cannot run: {first}\n", style="bold red")
        if d is not None and d.fit == "fail":
            return Text("✗ will not fit in GPU memory (ctrl+t: advice)\n", style="bold red")
        return Text("✓ ctrl+l checks it (preflight) and launches\n", style="bold green")

    def preview_text(self) -> str:
        """The side pane as plain text (tests, and a user's copy)."""
        facts = self.query_one("#side-facts", Static).render()
        body = self.query_one("#preview", Static).render()
        return f"{facts}\n{body}"

    # -- loading --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="compose-load", exit_on_error=False)
    def _read_spec(self, path: Path) -> None:
        from tunedeck.core.spec import load_spec

        try:
            self.post_message(SpecLoaded(load_spec(path), path))
        except SpecError as e:
            self.post_message(SpecLoaded(None, path, str(e)))

    @on(SpecLoaded)
    def _spec_loaded(self, msg: SpecLoaded) -> None:
        if msg.spec is None:
            self.notify(msg.error, severity="error", timeout=15)
            return
        self.load(msg.spec, msg.path)

    def load(self, spec: RunSpec, path: Path | None = None, title: str = "") -> None:
        """Put a whole spec in the form (a preset, a file)."""
        self.spec = copy.deepcopy(spec)
        self.path = path
        self.heading = title
        self.dirty = False
        self.unsaved = path is None
        self._sync_form()

    def action_preset(self) -> None:
        from tunedeck.tui.screens.presets import PresetPicker

        def picked(choice) -> None:
            if choice:
                path, spec = choice
                self.load(spec, path)

        self.app.push_screen(PresetPicker(), picked)

    # -- advice -----------------------------------------------------------------------------------
    def action_advice(self) -> None:
        d = self.preview
        if d is None or d.estimate is None or isinstance(d.estimate, str):
            why = (
                d.estimate
                if d is not None and isinstance(d.estimate, str)
                else (d.error if d is not None and d.error else "the preview is not ready")
            )
            self.notify(f"no estimate to advise on: {why}", severity="warning")
            return
        self._advise(d, copy.deepcopy(self.spec))

    @work(thread=True, exclusive=True, group="compose-advice", exit_on_error=False)
    def _advise(self, d: PreviewData, spec: RunSpec) -> None:
        est = d.estimate
        cap = d.gpu_mem_gib or est.gpu_mem_gib or 80.0
        gpus = max(d.gpu_count or (est.inputs.world_size // max(spec.cluster.nnodes, 1)), 1)
        try:  # the advice `tunedeck estimate` prints for this spec
            a = api.advice_for(est, spec, gpus=gpus, gpu_mem_gib=cap)[0]
        except Exception as e:  # noqa: BLE001 - shown, not fatal
            self.post_message(AdviceReady(Text(""), {}, f"{type(e).__name__}: {e}"))
            return
        t = Text()
        t.append(f"advice: {a.strategy} on {a.gpus} GPU(s) of {cap:.0f} GiB", style="bold")
        t.append(
            (", gradient checkpointing" if a.gradient_checkpointing else "")
            + (", CPU offload" if a.offload else "")
            + f" · ≈{a.per_gpu_gib:.1f} GiB "
            "per GPU\n"
        )
        for r in a.reasons:
            t.append(f"  - {r}\n")
        for line in api.speed_flag_lines(a):
            t.append(line + "\n", style="dim" if line.startswith(" ") else "")
        if a.overrides:
            t.append("values: ", style="bold")
            t.append(", ".join(f"{k} = {fmt_value(v)}" for k, v in a.overrides.items()) + "\n")
        self.post_message(AdviceReady(t, dict(a.overrides)))

    @on(AdviceReady)
    def _advice_ready(self, msg: AdviceReady) -> None:
        if msg.error:
            self.notify(f"the advisor failed: {msg.error}", severity="error")
            return

        def answered(apply: bool | None) -> None:
            if apply:
                self.apply_values(msg.overrides, "the advice")

        self.app.push_screen(AdviceScreen(msg.text, bool(msg.overrides)), answered)

    def apply_values(self, values: dict[str, Any], what: str) -> None:
        """Dotted-key values from elsewhere (the advisor, the gate's fixes) into the form."""
        if not values:
            return
        try:
            self.spec = set_values(self.spec, values)
        except SpecError as e:
            self.notify(f"cannot apply {what}: {'; '.join(e.problems)}", severity="error")
            return
        self.dirty = True
        self._sync_form()
        self.notify(f"{what}: " + ", ".join(f"{k} = {fmt_value(v)}" for k, v in values.items()))

    # -- save ---------------------------------------------------------------------------------------
    def action_goto(self) -> None:
        """Focus a field by its key, or the end of one (`max_steps`, `lr` finds
        `train.learning_rate` only by its full word: `learning_rate`)."""

        def chosen(text: str | None) -> None:
            if not text:
                return
            want = text.strip().lower()
            rows = [r for r in self.rows() if r.display]
            hit = next((r for r in rows if r.option.key == want), None) or next(
                (r for r in rows if r.option.key.endswith("." + want)), None
            )
            if hit is None:
                self.notify(f"no field {text!r} shown for this spec", severity="warning")
                return
            focusable = hit.query("Input, Select, Checkbox, Switch").first()
            focusable.focus()
            hit.scroll_visible()

        self.app.push_screen(
            PromptScreen("Go to the field (its key, e.g. train.max_steps or max_steps):"), chosen
        )

    def action_save(self) -> None:
        if self.field_errors:
            self.notify(
                "fix the fields first: " + "; ".join(self.field_errors.values()), severity="error"
            )
            return

        def chosen(text: str | None) -> None:
            if text:
                target = Path(text).expanduser()
                self._save(target, self._save_spec(target))

        self.app.push_screen(
            PromptScreen("Save the spec as TOML:", value=str(self.save_proposal())), chosen
        )

    def save_proposal(self) -> Path:
        """Where ctrl+s proposes to save: the spec's own file, except a preset shipped with
        tunedeck (an upgrade would replace it), which goes to the user's home."""
        if self.path is None:
            return Path.cwd() / f"{self.spec.name}.toml"
        if self.path.resolve().is_relative_to(PRESETS_DIR.resolve()):
            return Path.home() / self.path.name
        return self.path

    def _save_spec(self, target: Path) -> RunSpec:
        """The spec as written to `target`: paths are absolute once loaded, so those inside
        the file's folder are written relative to it again (a preset saved in place keeps
        `data/demo_chat.jsonl`), the others stay absolute (they point anywhere from there)."""
        spec = copy.deepcopy(self.spec)
        resolve_paths(spec, self.path.parent if self.path else Path.cwd())
        folder = target.parent.resolve()
        for section, key in (
            (spec.data, "path"),
            (spec.data, "val_path"),
            (spec.script, "path"),
            (spec.model, "path"),
        ):
            value = getattr(section, key)
            if value and Path(value).is_absolute() and Path(value).is_relative_to(folder):
                setattr(section, key, str(Path(value).relative_to(folder)))
        return spec

    @work(thread=True, exclusive=True, group="compose-save", exit_on_error=False)
    def _save(self, path: Path, spec: RunSpec, replace: bool = False) -> None:
        from tunedeck.core.spec import load_spec

        if not replace and path.exists():
            shipped = path.resolve().is_relative_to(PRESETS_DIR.resolve())
            self.post_message(SaveExists(path, spec, shipped))
            return
        # a secret's value is never written: the run gets it from the launching shell; the
        # value of a credential flag in the args is saved as **** (core/spec.py's one rule)
        secrets = sorted(k for k, v in spec.env.items() if v and is_secret_name(k))
        for k in secrets:
            del spec.env[k]
        masked = mask_spec(spec)
        if (
            masked.swift.extra_args != spec.swift.extra_args
            or masked.script.args != spec.script.args
        ):
            secrets.append("credential flags in the args (saved as ****)")
        spec = masked
        head = "# tunedeck run spec (saved from the compose screen)\n"
        if secrets:
            head += (
                f"# not saved, secrets: {', '.join(secrets)}; export them in the shell "
                "that launches\n"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(head + spec.to_toml(), encoding="utf-8")
            tmp.replace(path)
        except OSError as e:
            self.post_message(Saved(path, f"cannot write {path}: {e.strerror or e}"))
            return
        note = f"; not saved (secrets): {', '.join(secrets)}" if secrets else ""
        try:
            load_spec(path)
        except SpecError as e:  # saved as asked; say what `tunedeck launch` will refuse
            note += f"; it will not load until fixed: {'; '.join(e.problems)}"
        self.post_message(Saved(path, "", note))

    @on(SaveExists)
    def _save_exists(self, msg: SaveExists) -> None:
        from tunedeck.tui.screens.confirm import ConfirmScreen

        what = "a preset shipped with tunedeck" if msg.shipped else "a file"
        question = f"{msg.path} is {what} that exists. Overwrite it?"

        def answered(yes: bool | None) -> None:
            if yes:
                self._save(msg.path, msg.spec, replace=True)
            else:
                self.notify("not saved", timeout=5)

        self.app.push_screen(ConfirmScreen(question, yes_label="Overwrite"), answered)

    @on(Saved)
    def _saved(self, msg: Saved) -> None:
        if msg.error:
            self.notify(msg.error, severity="error", timeout=10)
            return
        self.path = msg.path
        self.dirty = False
        self.unsaved = False
        self.query_one(TitleBar).update(TitleBar._text(self._title_text()))
        self.notify(
            f"saved {msg.path}{msg.note}",
            severity="warning" if msg.note else "information",
            timeout=10,
        )

    # -- launch: through the preflight gate ------------------------------------------------------
    def action_launch(self) -> None:
        if self.field_errors:
            self.notify(
                "fix the fields first: " + "; ".join(self.field_errors.values()), severity="error"
            )
            return
        from tunedeck.tui.screens.preflight import PreflightScreen

        gate = PreflightScreen(self.launch_spec(), self.path, gate=True)
        gate.dismiss_on_launch = True

        def back(result) -> None:
            if isinstance(result, str):  # launched: the monitor replaces this form
                from tunedeck.tui.screens.monitor import MonitorScreen

                self.dirty = False
                self.app.switch_screen(MonitorScreen(result))
            elif result:  # fixes applied at the gate
                self.apply_values(result, "applied at preflight")

        self.app.push_screen(gate, back)

    def action_back(self) -> None:
        if not (self.dirty or self.unsaved):
            self.app.pop_screen()
            return
        from tunedeck.tui.screens.confirm import ConfirmScreen

        what = "the changes to" if self.dirty else "the unsaved spec"
        question = f"Discard {what} {self.spec.name}? (ctrl+s saves it)"

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.pop_screen()

        self.app.push_screen(ConfirmScreen(question, yes_label="Discard"), answered)
