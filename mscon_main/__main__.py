"""``python -m mscon``: the ``mscon`` command. The wheel installs this file as ``mscon/__main__.py``
(pyproject's ``force-include``); the checkout keeps it apart because ``mscon`` is only the
installed import root (``console/`` becomes ``mscon/console``, and so on)."""

import sys

from mscon.console.cli.main import main

sys.exit(main())
