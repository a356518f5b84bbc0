"""``python -m mscon.console.cli``: the same as the ``mscon`` command."""

import sys

from mscon.console.cli.main import main

sys.exit(main())
