"""A run's minutes: the calibration (rates measured on this machine), each stage's estimate and the budget's
cuts."""
