"""``python -m mscon.console``: the ``mscon`` command where no console script is installed
(a ``pip install --target`` tree, a box without the venv's bin on PATH)."""

import sys

from .cli import main

sys.exit(main())
