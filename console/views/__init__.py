"""Front ends on the event bus: headless (prefixed logs, summary, recorder) and the TUI."""
