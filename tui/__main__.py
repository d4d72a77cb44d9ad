import sys

from tunedeck.tui.cli import main

sys.exit(main())
