"""tunedeck's command line (`tunedeck VERB`): one module per verb, each with
`register(subparsers)` that adds its parser and sets `func`; `tunedeck.cli.main` assembles the
parser (`VERBS`, plain imports) and runs a verb. Without a verb it opens the TUI, imported only
then. From the core the CLI imports only `tunedeck.core.api`, `tunedeck.core.spec` and
`tunedeck.core.rundir` (an import-linter contract in pyproject.toml). Keep imports of heavy
packages inside the command functions: `tunedeck ls` loads neither textual nor torch."""
