"""`python -m tunedeck.tui`: the command line under its old name (the TUI without a verb);
the command line is `tunedeck.cli`."""

import sys

from tunedeck.cli.main import main

sys.exit(main())
