import sys

from tunedeck.cli.main import main

sys.exit(main())
