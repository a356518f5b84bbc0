"""The mscon node agent: stdlib (+ optional psutil) only, deployed to each node over SFTP."""

AGENT_FILES = (
    "__init__.py",
    "__main__.py",
    "main.py",
    "procs.py",
    "protocol.py",
    "tail.py",
    "evidence.py",
    "checks.py",
    "mesh.py",
    "devices.py",
    "journal.py",
    "layout.py",
    "coord.py",
    "daemon.py",
    "detached.py",
    "relay.py",
    "streams.py",
    "metrics.py",
    "outbox.py",
    "policy.py",
)
