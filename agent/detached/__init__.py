"""Runs that outlive the console: the daemon and its socket (daemon), the coordinator's
signed links (coord), the policy's node-0 host (run), and the relay `mscon attach` reaches
it through (relay)."""
