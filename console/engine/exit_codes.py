"""Exit codes of the headless commands, in one place (see the README)."""

from mscon.agent import exit_codes as agent_exit_codes

OK = 0
INTERNAL = 1  # a bug in mscon, or ranks that ended without a verdict
USAGE = 2  # bad command line or inventory
PREFLIGHT = 3  # preflight checks failed
UNREACHABLE = 4  # a node could not be reached, prepared, or was lost
INTERRUPTED = agent_exit_codes.INTERRUPTED  # Ctrl-C / SIGTERM (130, the agent reports it too)
# A failed run exits with its root-cause rank's code, or 128 + signal number.
OUTPUT_CLOSED = 141  # our stdout was closed (`| head`): 128 + SIGPIPE, as a shell reports it
HUNG = 124  # the root-cause rank hung (no progress, or stopped by a signal), as timeout(1)
