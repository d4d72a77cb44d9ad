"""Subcommands beyond the core run commands. Each module has `register(subparsers)` that adds
its parser and sets `func`; `tunedeck.tui.cli.COMMAND_MODULES` lists them. Keep imports of heavy
packages inside the command functions."""
