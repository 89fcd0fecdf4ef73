"""split_data accounts for every line of the train file (kept, or rejected with its reason in rejects.jsonl), its
carve leaves every class train rows (drawn per class only where the seeded draw would not), and
validation.rows = auto fits the file's size."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transferset.config import RunConfig
from transferset.data.splits import _quotas, auto_rows, split_data
from transferset.runtime import typed
from transferset.runtime.errors import UserError


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _config(**values) -> RunConfig:
    return typed.load(RunConfig, {"students": {"s": {}}, **values}, where="test")


def _stats(out) -> dict:
    return json.loads((out / "split.json").read_text())


def _accounted(stats: dict) -> None:
    """Every line read is kept or rejected, and every kept row is in one file or left out with a reason."""
    assert stats["input_rows"] == stats["train_rows"] + stats["rejected_rows"]
    assert stats["train_rows"] == (stats["validation_rows"] + stats["labeled_rows"] + stats["unlabeled_rows"]
                                   + stats["rest_rows"] + stats["pool_rows_dropped_as_validation_copies"]
                                   + stats["pool_rows_dropped_inside_validation_rows"])


def _rows(n: int) -> list[dict]:
    return [{"text": f"review number {i} says {'good' if i % 2 else 'bad'} things", "label": str(i % 2)}
            for i in range(n)]


def test_a_quoted_newline_in_a_csv_is_rejected_line_by_line_and_counted(tmp_path):
    lines = ["text,label", *(f"{r['text']},{r['label']}" for r in _rows(298))]
    lines.insert(100, '"a review that runs\non over two lines",1')  # one record, two physical lines
    path = tmp_path / "train.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert path.read_bytes().count(b"\n") - 1 == 300  # data lines, as `wc -l` counts them
    out = tmp_path / "data"
    split_data(str(path), str(out), _config(validation={}))
    stats = _stats(out)
    assert (stats["input_rows"], stats["train_rows"], stats["rejected_rows"]) == (300, 298, 2)
    _accounted(stats)
    rejects = _read(out / "rejects.jsonl")
    assert [r["line"] for r in rejects] == [101, 102]
    assert all("a row must fit on one line" in r["reason"] for r in rejects)
    assert stats["first_rejects"][0]["line"] == 101 and stats["rejects"] == "rejects.jsonl"


def test_jsonl_rows_without_the_text_key_are_rejected_with_the_reason(tmp_path):
    rows = _rows(299)
    rows[7] = {"body": "no text key here", "label": "1"}
    rows[250] = {"label": "0"}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "data"
    split_data(str(path), str(out), _config(validation={"rows": 20}, labeled_limit=100))
    stats = _stats(out)
    assert (stats["input_rows"], stats["rejected_rows"]) == (299, 2)
    _accounted(stats)
    rejects = _read(out / "rejects.jsonl")
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (8, "missing text column 'sentence or text' (use --text-column)"),
        (251, "missing text column 'sentence or text' (use --text-column)")]


def test_parquet_rows_with_a_null_text_are_rejected_and_counted(tmp_path):
    rows = _rows(301)
    rows[0]["text"] = None
    rows[300]["text"] = None
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "data"
    split_data(str(path), str(out), _config(validation={}))
    stats = _stats(out)
    assert (stats["input_rows"], stats["train_rows"], stats["rejected_rows"]) == (301, 299, 2)
    _accounted(stats)
    assert [(r["line"], r["reason"]) for r in _read(out / "rejects.jsonl")] == [(1, "empty text"), (301, "empty text")]


def test_a_file_with_every_row_rejected_is_refused_with_its_first_problems(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"body": f"x {i}", "label": "1"}) + "\n" for i in range(4)))
    with pytest.raises(UserError, match="every row was rejected \\(4 rows\\)"):
        split_data(str(path), str(tmp_path / "data"), _config(validation={}))


@pytest.fixture
def many_labels(tmp_path):
    """2,500 rows over 1,000 labels (names, not indices: a missing one is missing from an inferred set)."""
    rows = [{"text": f"item {i} of kind {i % 1000} is here", "label": f"kind{i % 1000:04d}"} for i in range(2500)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_no_class_vanishes_into_the_carve(tmp_path, many_labels):
    out = tmp_path / "data"
    split_data(str(many_labels), str(out), _config(validation={"rows": 100}))
    stats = _stats(out)
    assert stats["validation_stratified"] and stats["validation_rows"] == 100 and len(stats["label_names"]) == 1000
    _accounted(stats)
    assert {r["label"] for r in _read(out / "labeled.jsonl")} == set(stats["label_names"])
    # the seeded draw over all rows (stratify: false) holds out every row of some classes
    plain = tmp_path / "plain"
    split_data(str(many_labels), str(plain), _config(validation={"rows": 100, "stratify": False}))
    assert not _stats(plain)["validation_stratified"]
    assert len({r["label"] for r in _read(plain / "labeled.jsonl")}) < 1000


def test_a_carve_that_serves_every_class_is_the_seeded_draw_unchanged(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(400)), encoding="utf-8")
    carved = {}
    for stratify in (None, False):
        out = tmp_path / f"s{stratify}"
        split_data(str(path), str(out), _config(validation={"rows": 40, "stratify": stratify}))
        carved[stratify] = (out / "validation.jsonl").read_bytes(), (out / "labeled.jsonl").read_bytes()
        assert not _stats(out)["validation_stratified"]
    assert carved[None] == carved[False]


def test_stratify_true_holds_out_each_class_in_proportion(tmp_path):
    # 360 rows of class a, 40 of class b: 40 validation rows → 36 and 4
    rows = [{"text": f"sentence {i} here", "label": "b" if i % 10 == 0 else "a"} for i in range(400)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "data"
    split_data(str(path), str(out), _config(validation={"rows": 40, "stratify": True, "by": "row"}))
    held = [r["label"] for r in _read(out / "validation.jsonl")]
    assert (held.count("a"), held.count("b")) == (36, 4)


def test_quotas_are_proportional_one_per_class_where_possible_and_never_all_of_a_class():
    assert _quotas([90, 10], [90, 10], 10, False) == [9, 1]
    assert _quotas([97, 2, 1], [97, 2, 1], 10, False) == [9, 1, 0]  # the 1-row class keeps its row
    assert _quotas([3, 3, 3], [3, 3, 3], 2, False) == [1, 1, 0]  # fewer rows than classes: largest shares first
    with pytest.raises(UserError, match="at most 3 rows"):
        _quotas([2, 2, 2], [2, 2, 2], 4, False)
    assert _quotas([2, 2, 2], [2, 2, 2], 4, True) == [1, 1, 1]  # auto: what there is room for


def test_auto_rows_fit_the_file():
    assert auto_rows(300, 2) == 30  # 10 %
    assert auto_rows(50, 2) == 10  # raised toward 5 per class, at most 20 %
    assert auto_rows(2500, 1000) == 500  # 5 per class would be 5,000: 20 % of the rows
    assert auto_rows(67_349, 2) == 2000  # the cap


def test_the_default_carve_works_on_a_small_file_and_a_file_too_small_is_refused(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(40)), encoding="utf-8")
    out = tmp_path / "data"
    split_data(str(path), str(out), _config(validation={}))
    assert _stats(out)["validation_rows"] == 8 == len(_read(out / "validation.jsonl"))
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text("".join(json.dumps(r) + "\n" for r in [*_rows(2), {"text": "one more", "label": "2"}]))
    with pytest.raises(UserError, match="3 accepted rows over 3 classes, too few to carve.*--dev FILE"):
        split_data(str(tiny), str(tmp_path / "tiny"), _config(validation={}))
    assert not (tmp_path / "tiny").exists()
