"""The command line: `mscon run | up | check | validate | replay | attach | ls | logs | stop`."""
