"""A run's data read and written: the train file's splits, transfer sets read back, evaluation sets, predictions, model cards."""
