"""`transferset run` and `transferset init`: the run's orchestration, its preflight checks and its starter config."""
