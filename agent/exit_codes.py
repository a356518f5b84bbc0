"""Exit codes the agent and the console both report (console/engine/exit_codes.py takes these)."""

INTERRUPTED = 130  # Ctrl-C / SIGTERM, or a stop asked for: 128 + SIGINT, as a shell reports it
