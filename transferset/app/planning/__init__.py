"""A run's minutes: the calibration (rates measured on this machine), the estimate of each stage and the budget's cuts."""
