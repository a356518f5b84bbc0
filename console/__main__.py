"""``python -m mscon.console``: the ``mscon`` command where no console script is installed
(a ``pip install --target`` tree, a box without the venv's bin on PATH)."""

import sys

from mscon.console.cli.main import main

sys.exit(main())
