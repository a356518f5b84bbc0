"""The run's engine: supervisor, session, events, ClusterState, the bus. No I/O to a screen."""
