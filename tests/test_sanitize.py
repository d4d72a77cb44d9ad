"""Names and messages shown in a terminal are stripped of control and bidi characters (one
function, tui/format.py `clean`): a run name holding ESC sequences, BEL, NUL or U+202E reaches
neither the CLI's output nor the TUI's runs list and titles raw."""

from __future__ import annotations

import json

import pytest

from tunedeck.core.rundir import RunDir
from tunedeck.tui.format import clean
from tests.conftest import cli
from tests.test_manage import make_run

EVIL = "ev\x1b[2J\x1b[31mil\x1b]0;pwned\x07\x07\u202eoh\u2066x\u2067y\u2068z\u2069\x00\x9b1m\r\nend"
# what a terminal could act on: C0/C1 controls, DEL, bidi embeddings/overrides/isolates/marks
BAD_CHARS = {
    *map(chr, range(0x20)),
    "\x7f",
    *map(chr, range(0x80, 0xA0)),
    "\u061c",
    "\u200e",
    "\u200f",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
    "\u2028",
    "\u2029",
}

TABLE = [
    ("\x1b[31mred\x1b[0m", "red"),  # CSI (colours, cursor moves, clear screen)
    ("a\x1b[2Jb", "ab"),
    ("a\x1b]0;title\x07b", "ab"),  # OSC (window title), BEL-terminated
    ("a\x1b]8;;http://x\x1b\\b", "ab"),  # OSC, ST-terminated (hyperlinks)
    ("a\x1bcb", "ab"),  # a two-byte escape (RIS: reset terminal)
    ("bell\x07", "bell"),
    ("nul\x00l", "null"),
    ("\u202eevil", "evil"),  # RIGHT-TO-LEFT OVERRIDE
    ("a\u2066b\u2067c\u2068d\u2069e", "abcde"),  # bidi isolates
    ("a\u200fb\u200ec\u061cd", "abcd"),  # bidi marks
    ("a\x9b31mb", "ab"),  # 8-bit CSI
    ("a\x85b\u2028c", "a b c"),  # NEL, LINE SEPARATOR: a line break each
    ("tab\there", "tab here"),
    ("two\r\nlines", "two lines"),
    ("lone \udc80 surrogate", "lone  surrogate"),
    ("café 训练 🚀 ok-name_1", "café 训练 🚀 ok-name_1"),  # plain text stays
]


@pytest.mark.parametrize("raw,shown", TABLE, ids=[repr(r)[:24] for r, _ in TABLE])
def test_clean_table(raw, shown):
    assert clean(raw) == shown


def test_clean_keeps_line_breaks_of_messages_only_when_asked():
    assert clean("a\nb\x1b[1m", multiline=True) == "a\nb"
    assert clean("a\r\nb\u2028c", multiline=True) == "a\nb\nc"
    assert clean(None) == "" and clean(42) == "42"


def _evil_run(home) -> str:
    run_id = "20251124-090000-evil-a1b2"
    make_run(home / "runs", run_id, name="x", status="failed")
    rd = RunDir(home / "runs" / run_id)
    st = rd.read_state()
    st.update(name=EVIL, message="boom " + EVIL)
    rd.write_state(st)
    return run_id


def _assert_clean(text: str) -> None:
    found = sorted({repr(c) for c in text if c in BAD_CHARS and c != "\n"})
    assert found == [], found


def test_cli_prints_names_and_messages_clean(td_home):
    run_id = _evil_run(td_home)
    for verb in (["ls"], ["status", run_id], ["status", "20251124"]):
        proc = cli(*verb, home=td_home)
        _assert_clean(proc.stdout)
        _assert_clean(proc.stderr)
    shown = clean(EVIL)
    assert shown == "evilohxyz end"  # the printable text itself stays
    out = cli("status", run_id, home=td_home).stdout
    assert f"name      {shown}\n" in out and f"boom {shown}" in out
    assert shown in cli("ls", home=td_home).stdout
    # --json is JSON: escaped, and exact
    data = json.loads(cli("status", run_id, "--json", home=td_home).stdout)
    assert data["name"] == EVIL
    # a reference that matches nothing is echoed clean
    proc = cli("status", "no\x1b[2Jsuch\u202e", home=td_home, check=False)
    assert proc.returncode == 1
    _assert_clean(proc.stderr)
    assert proc.stderr.startswith("tunedeck: no run ") and "such" in proc.stderr


def test_titlebar_is_clean():
    from tunedeck.tui.widgets.titlebar import TitleBar

    text = TitleBar._text(f"monitor · {EVIL}")
    _assert_clean(text)
    assert text.startswith("tunedeck · monitor · ev")


async def test_runs_list_shows_names_clean(td_home, monkeypatch):
    from textual.widgets import DataTable

    from tests.conftest import until
    from tunedeck.tui.app import TunedeckApp
    from tunedeck.tui.screens.runs import RunsScreen

    run_id = _evil_run(td_home)
    app = TunedeckApp(refresh_s=0.1)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, RunsScreen)
                and app.screen.query_one("#runs-table", DataTable).row_count == 1
            ),
        )
        table = app.screen.query_one("#runs-table", DataTable)
        cells = [str(c) for c in table.get_row(run_id)]
        for c in cells:
            _assert_clean(c)
        assert clean(EVIL) in cells
