"""A console's memory of the runs it started: each run's recording and the list of past runs."""
