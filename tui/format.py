"""The TUI's formatting: the colour of a status word; the text helpers both front ends share
(`clean`, the one sanitiser for text a terminal shows, and the number formats) live in
`tunedeck.core.text` and are re-exported here for the screens."""

from __future__ import annotations

from tunedeck.core.api import (  # noqa: F401  (re-exported)
    clean,
    fmt_age,
    fmt_duration,
    fmt_loss,
    fmt_rate,
    print_json,
)

# a run's status word as every view colours it (the runs list, the monitor's progress pane);
# `lost`, `damaged` and `foreign` are the readers' own words for a gone agent, an unreadable
# state.json and another user's run (shown read-only, never acted on)
RUN_STATUS_STYLE = {
    "running": "bold green",
    "pending": "yellow",
    "succeeded": "cyan",
    "failed": "bold red",
    "stopped": "magenta",
    "lost": "bold yellow",
    "damaged": "bold red reverse",
    "foreign": "dim italic",
}
