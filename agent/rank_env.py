"""The ``MSCON_*`` names the agent sets in a rank's environment: one list, here.

The rank side reads them under the same names (``mscon_resume/env.py``, ``compile_cache.py``);
it ships without this package, so ``tests/unit/test_rank_env_names.py`` checks the two agree.
"""

ATTEMPT = "MSCON_ATTEMPT"  # this attempt's number (0 first), as torchrun's TORCHELASTIC_RESTART_COUNT
METRICS = "MSCON_METRICS"  # the rank's metrics file (JSON lines) in the attempt's folder
STATE_DIR = "MSCON_STATE_DIR"  # the run's state folder (its snapshots' node-memory twin is named by it)
SNAPSHOT_KEY = "MSCON_SNAPSHOT_KEY"  # the run's secret (hex): every snapshot carries its MAC
COMPILE_CACHE = "MSCON_COMPILE_CACHE"  # the run's compiled graphs on this node, for the restarts
PATH_PREPEND = "MSCON_PATH_PREPEND"  # the console's: a folder put first on PATH (a venv's bin), then dropped

# What differs between two runs of one job without changing what MindSpore saw at import and join
# (a kept standby fits the next run when nothing else differs: agent/kept.py).
PER_RUN = frozenset((METRICS, STATE_DIR, SNAPSHOT_KEY, COMPILE_CACHE))
