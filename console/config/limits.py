"""Every bound an inventory is held to, checked before the work it bounds grows (file size, nesting,
values after alias expansion, list lengths, text lengths, the cluster's size)."""

from __future__ import annotations

# The cluster's size (issue 44: the console drives 10,000 nodes of 8 ranks): 16,384 nodes, and as
# many ranks as 16,384 nodes of 8 devices. The file and value bounds leave room for that many nodes
# of a few fields each (about 100 bytes and 9 values a node written as a flow mapping).
MAX_NODES = 16384
MAX_DEVICES_PER_NODE = 1024
MAX_WORLD_SIZE = 131072
MAX_FILE_BYTES = 4 << 20
MAX_DEPTH = 32
MAX_YAML_VALUES = 400_000  # after alias expansion
MAX_INT_DIGITS = 18
MAX_NUMBER_CHARS = 32
MAX_TEXT = 4096  # paths, patterns, anything without a tighter bound
MAX_VALUE = 32768  # env values and argv words
MAX_ITEMS = 1024  # entries of one list or env mapping
MAX_HOST = 255
MAX_NAME = 64
MAX_USER = 32
MAX_ENV_KEY = 256
# Files an inventory names, checked to be regular files of at most this size before anything reads
# them (a key at /dev/zero was read until memory ran out): keys, ssh configs, .gitignore files and
# hostfiles are a few KiB; a known-hosts file may list every host of a site.
MAX_KEY_FILE_BYTES = 1 << 20
MAX_KNOWN_HOSTS_BYTES = 16 << 20
# ssh configs pulled in through Include (console/config/ssh_includes.py), each bounded as the config
# itself (MAX_KEY_FILE_BYTES): OpenSSH's depth limit, and a bound on how many files in all.
MAX_SSH_INCLUDE_DEPTH = 16
MAX_SSH_CONFIG_FILES = 256
