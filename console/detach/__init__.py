"""Runs that outlive the console: the detach record and attaching again."""
