"""Run the node agent.

Two ways in:

* ``python -m <agent package> --node NAME``: by hand, and in the agent's own tests.
* the console's boot code (``console/bundle.py``: ``AGENT_BOOT``), which reads the start header
  (``{"v": 1, "node": NAME, "dir": AGENT_DIR}``, plus ``"mode": "attach", "run": RUN_ID`` to reach
  a detached run or ``"mode": "ls"`` to list runs, with ``"cache"``: the console's cache folder on
  the node) from stdin, puts the folder on ``sys.path`` and
  runs this module with the header in ``_BOOT_HEADER``. The node name therefore never appears in
  a command line: not in the one the node's login shell parses, not in the process list.
"""

import os
import sys

from .main import main


def _argv():
    header = globals().get("_BOOT_HEADER")
    if header is None:
        return None  # sys.argv[1:]
    node = header.get("node") if isinstance(header, dict) else None
    if not isinstance(node, str):
        sys.stderr.write("mscon agent: the start header on stdin names no node\n")
        sys.stderr.flush()
        os._exit(2)
    argv = ["--node=" + node]  # one word: a name starting with "-" is not read as an option
    mode = header.get("mode")
    if mode == "attach" and isinstance(header.get("run"), str):
        argv.append("--attach=" + header["run"])
    elif mode == "ls":
        argv.append("--ls")
    if mode and isinstance(header.get("cache"), str):
        argv.append("--cache=" + header["cache"])
    return argv


code = main(_argv())
sys.stdout.flush()
sys.stderr.flush()
# Leave without interpreter shutdown: nothing is left to clean up, and the stdin thread may block it.
os._exit(code)
