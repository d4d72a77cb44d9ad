"""`tunedeck estimate SPEC`: memory per GPU with a breakdown, throughput/ETA and the advice.

The verb's code is still `tunedeck.tui.commands.estimate` (textual-free): the compose form's
ctrl+t asks its `advice_for`, and compose.py is being changed elsewhere now. It moves here,
and compose imports the advice from the core's api, once that change has landed; until then
this is the CLI's one import of the TUI package besides opening the app."""

from __future__ import annotations


def register(sub) -> None:
    from tunedeck.tui.commands import estimate

    estimate.register(sub)
