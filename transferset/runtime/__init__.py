"""What every part of transferset runs on: user errors, typed settings, the registry, threads, timing, malloc tuning, progress."""
