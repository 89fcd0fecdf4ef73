"""The label rule (transferset.contract.labels): names or class indices below MAX_CLASSES, nothing else."""
import pytest

from transferset.contract import labels
from transferset.runtime.errors import ConfigError


@pytest.mark.parametrize("value, index", [
    ("1", 1), (1, 1), (" 01 ", 1), ("0", 0), (999, None), ("pos", 1), ("neg", 0), ("7", None), ("other", None),
])
def test_valid_labels_map_to_their_class_or_are_outside_the_set(value, index):
    names = ("neg", "pos")
    assert labels.problem(value) is None
    assert labels.parse(value, names) == index


@pytest.mark.parametrize("value, says", [
    ("1.0", "is a number that is not a class index"), ("-1", "is a negative number"), (-1, "is a negative integer"),
    ("1e3", "is a number that is not a class index"), ("nan", "is a number that is not a class index"),
    ("١", "is a number that is not a class index"), ("1_0", "is a number that is not a class index"),
    ("1000", "is not a class index: at most 1000 classes (0..999)"), (10**30, "is not a class index"),
    ("9" * 5000, "(5,002 characters) is not a class index"), (1.0, "is a float"), (True, "is a boolean"),
    ([1], "is a list"), (None, "the label is missing (null)"), ("  ", "the label is empty"),
    ("x" * 201, "label name of 201 characters, longer than 200"), ("\ud83d", "is not valid Unicode"),
])
def test_anything_else_is_a_reject_with_its_reason(value, says):
    assert says in labels.problem(value)
    assert labels.parse(value, tuple(str(i) for i in range(1000))) is None


def test_a_set_of_integers_holds_the_labels_themselves():
    assert [labels.parse(v, ("0", "1", "5")) for v in ("5", 5, "05", "2", "1")] == [2, 2, 2, None, 1]


def test_check_names_refuses_what_a_reader_would_reject():
    assert labels.check_names(["neg", " pos "]) == ("neg", "pos")
    for names, says in ((["a"] * 2, "'a' is named twice"), (["1", "01"], "'01' is named twice"),
                        ([], "an empty label set"), (["0", "1.0"], "'1.0' is a number"),
                        ([str(i) for i in range(1001)], "1,001 labels, more than the 1000")):
        with pytest.raises(ConfigError, match=f"^--labels: .*{says}"):
            labels.check_names(names)
