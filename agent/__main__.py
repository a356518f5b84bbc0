"""``python -m <agent package> --node NAME``: run the node agent."""

import os
import sys

from .main import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# Leave without interpreter shutdown: nothing is left to clean up, and the stdin thread may block it.
os._exit(code)
