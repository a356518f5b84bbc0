"""Run the node agent.

Two ways in:

* ``python -m <agent package> --node NAME``: by hand, and in the agent's own tests.
* the console's boot code (``console/transport/bundle.py``: ``AGENT_BOOT``), which reads the start header
  (``{"v": 1, "node": NAME, "dir": AGENT_DIR}``, plus ``"mode": "attach", "run": RUN_ID`` to reach
  a detached run, ``"mode": "ls"`` to list runs or ``"mode": "prune"`` with ``"prune": {"keep": N,
  "older_than_days": D, "dry_run": B}`` to remove old ones, with ``"cache"``: the console's cache folder on
  the node) from stdin, puts the folder on ``sys.path`` and
  runs this module with the header in ``_BOOT_HEADER``. The node name therefore never appears in
  a command line: not in the one the node's login shell parses, not in the process list.
"""

import os
import sys

from .layout import private_bundle
from .main import main, serve

try:
    # Its own folders 0700 and their __pycache__ made 0700 before Python makes the next one under
    # the umask (the first, of this package, is made by the import that runs this: tightened here).
    private_bundle(os.path.dirname(os.path.abspath(__file__)))
except OSError:
    pass  # not this user's to change: it runs all the same


def _boot(header: object) -> int:
    """Serve as the console's start header says (no argparse: it is parsed already)."""
    node = header.get("node") if isinstance(header, dict) else None
    if not isinstance(node, str):
        sys.stderr.write("mscon agent: the start header on stdin names no node\n")
        sys.stderr.flush()
        os._exit(2)
    assert isinstance(header, dict)
    mode, cache = header.get("mode"), header.get("cache")
    run = header.get("run")
    prune = header.get("prune")
    return serve(
        node,
        attach=run if mode == "attach" and isinstance(run, str) else None,
        ls=mode == "ls",
        cache=cache if mode and isinstance(cache, str) else None,
        prune=prune if mode == "prune" and isinstance(prune, dict) else None,
    )


header = globals().get("_BOOT_HEADER")
code = main() if header is None else _boot(header)
sys.stdout.flush()
sys.stderr.flush()
# Leave without interpreter shutdown: nothing is left to clean up, and the stdin thread may block it.
os._exit(code)
