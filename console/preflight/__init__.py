"""Preflight: the checks each agent runs, the console's side of them, and their report."""
