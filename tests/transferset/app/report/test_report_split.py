"""The report says how every line of a split train file went: kept (and where) or rejected."""
from transferset.app.report import _split_html, split_line


def test_the_report_counts_every_train_line():
    stats = {"input_rows": 301, "train_rows": 299, "rejected_rows": 2, "rejects": "rejects.jsonl",
             "validation_rows": 30, "validation_stratified": True, "labeled_rows": 200, "unlabeled_rows": 50,
             "rest_rows": 15, "pool_rows_dropped_as_validation_copies": 1, "pool_rows_dropped_inside_validation_rows": 3}
    assert split_line(stats) == ("301 train rows read; 299 kept: 30 validation (drawn per class), 200 labeled, "
                                 "50 unlabeled, 15 in no pool, 1 copies and 3 phrases of validation rows left out; "
                                 "2 rejected (each with its reason in data/rejects.jsonl).")
    assert split_line({**stats, "input_rows": 299, "rejected_rows": 0}).endswith("; 0 rejected.")
    assert _split_html(None) == [] and "<h2>Train file</h2>" in _split_html(stats)
