"""`python -m simindex ...` runs the command line (the same as the `simindex` command)."""

import sys

from .cli import main

sys.exit(main())
