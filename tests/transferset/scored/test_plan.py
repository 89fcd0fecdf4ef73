"""transferset/scored/plan.py, the parts that need no teacher: the input's identity (what --resume compares),
a teacher's recorded dev accuracy, and the label check. The whole plan runs in tests/pipelines/test_score.py."""
import json
import os

import pytest

from transferset import testing
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import UserError
from transferset.scored import plan


def _input(tmp_path, name, shards):
    out = testing.write_transfer_set(str(tmp_path / name), [testing.transfer_rows(texts) for texts in shards],
                                     ("0", "1"))
    return out, sorted(transfer.data_files(out))


def test_the_input_identity_counts_rows_from_the_footers_and_fingerprints_the_shards(tmp_path):
    path, files = _input(tmp_path, "a", [["a good film", "dull"], ["fine"]])
    identity = plan.input_identity(path, files)
    assert identity["path"] == os.path.abspath(path) and (identity["files"], identity["rows"]) == (2, 3)
    assert plan.input_identity(path, files, file_rows=[2, 1]) == identity  # the footers' counts, given
    # the same texts in other shards, or one row more: another input
    other, other_files = _input(tmp_path, "b", [["a good film"], ["dull", "fine"]])
    assert plan.input_identity(other, other_files)["fingerprint"] != identity["fingerprint"]
    more, more_files = _input(tmp_path, "c", [["a good film", "dull"], ["fine", "long"]])
    assert plan.input_identity(more, more_files)["rows"] == 4


@pytest.mark.parametrize("metrics, expect", [
    ({"best_dev_accuracy": 0.875}, 0.875),
    ({"best_dev_accuracy": 1}, 1.0),
    ({"best_dev_accuracy": True}, None),  # a boolean is not an accuracy
    ({"best_dev_accuracy": "0.9"}, None),
    ({}, None),
    ([0.9], None),  # not an object
])
def test_a_teachers_dev_accuracy_comes_from_its_metrics(tmp_path, metrics, expect):
    (tmp_path / schema.METRICS_FILE).write_text(json.dumps(metrics))
    assert plan.dev_accuracy(str(tmp_path)) == expect
    assert plan.dev_accuracy(str(tmp_path / "no_teacher_here")) is None


def test_labels_that_differ_are_refused_with_both_sets_and_what_to_do():
    plan._check_labels("t", ["neg", "pos"], "in", ["neg", "pos"])  # the same: nothing to say
    with pytest.raises(UserError, match=r"the teacher t predicts \['neg', 'pos'\].*transfer set in has labels "
                                        r"\['0', '1'\]\. Fine-tune the teacher"):
        plan._check_labels("t", ["neg", "pos"], "in", ["0", "1"])
