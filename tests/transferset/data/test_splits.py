"""split_data: the validation split is carved first, disjoint from both pools, copies of its texts included."""
import json

import pytest

from transferset.config import RunConfig
from transferset.data.splits import split_data
from transferset.runtime import typed
from transferset.runtime.errors import UserError


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _config(**values) -> RunConfig:
    return typed.load(RunConfig, {"students": {"s": {}}, **values}, where="test")


@pytest.fixture
def train_file(tmp_path):
    # 60 rows, two labels; rows 50-59 repeat the texts of rows 0-9 (SST-2 repeats many phrases)
    lines = ["sentence\tlabel"] + [f"phrase number {i % 50}\t{i % 2}" for i in range(60)]
    path = tmp_path / "train.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_validation_is_seeded_and_disjoint_from_both_pools(tmp_path, train_file):
    cfg = _config(validation={"rows": 8, "seed": 3}, labeled_limit=20, unlabeled_rows=-1)
    paths = split_data(train_file, str(tmp_path / "a"), cfg)
    validation = _read(paths["validation"])
    labeled, unlabeled = _read(paths["labeled"]), _read(paths["unlabeled"])
    assert len(validation) == 8 and all(set(r) == {"text", "label"} for r in validation)
    held = {r["text"] for r in validation}
    assert not held & {r["text"] for r in labeled + unlabeled}
    stats = json.loads((tmp_path / "a" / "split.json").read_text())
    dropped = stats["pool_rows_dropped_as_validation_copies"]
    assert stats["pool_rows_dropped_inside_validation_rows"] == 0  # no row here holds another
    assert len(labeled) == 20 and stats["validation_rows"] == 8
    assert 8 + dropped + len(labeled) + len(unlabeled) == 60  # every train row is accounted for
    assert dropped >= 1  # some held-out texts repeat later in the file
    # The same seed carves the same rows; another seed other rows.
    again = split_data(train_file, str(tmp_path / "b"), cfg)
    assert _read(again["validation"]) == validation
    other = split_data(train_file, str(tmp_path / "c"), _config(validation={"rows": 8, "seed": 4}, labeled_limit=20))
    assert _read(other["validation"]) != validation


@pytest.fixture
def phrases_file(tmp_path):
    # SST-2's shape: 20 sentences, and as rows of their own 2 phrases of each (one shared by all)
    lines = ["sentence\tlabel"]
    for k in range(20):
        lines += [f"the film number {k} has good words here\t{k % 2}", f"film number {k}\t{k % 2}",
                  f"good words here\t{k % 2}"]
    path = tmp_path / "phrases.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _inside(text: str, other: str) -> bool:
    return f" {text} " in f" {other} "


def test_validation_by_sentence_holds_out_whole_sentences_and_every_phrase_of_them(tmp_path, phrases_file):
    cfg = _config(validation={"rows": 5, "seed": 1}, labeled_limit=10, unlabeled_rows=-1)
    paths = split_data(phrases_file, str(tmp_path / "a"), cfg)
    validation = [r["text"] for r in _read(paths["validation"])]
    pools = [r["text"] for r in _read(paths["labeled"]) + _read(paths["unlabeled"])]
    assert len(validation) == 5 and all(t.startswith("the film number") for t in validation)
    # no pool row is a validation sentence or a part of one; the other sentences' phrases stay
    assert not [p for p in pools if any(_inside(p, v) for v in validation)]
    assert sum(t.startswith("film number") for t in pools) == 15
    stats = json.loads((tmp_path / "a" / "split.json").read_text())
    # 5 own phrases + 20 copies of the shared one, every one inside a validation sentence
    assert stats["pool_rows_dropped_inside_validation_rows"] == 5 + 20
    assert stats["pool_rows_dropped_as_validation_copies"] == 0
    assert 5 + 25 + len(pools) == 60  # every train row is accounted for


def test_validation_by_row_may_hold_out_phrases_and_by_sentence_refuses_too_many(tmp_path, phrases_file):
    by_row = split_data(phrases_file, str(tmp_path / "a"), _config(validation={"rows": 30, "by": "row"}))
    validation = [r["text"] for r in _read(by_row["validation"])]
    assert sum(not t.startswith("the film number") for t in validation) >= 10  # only 20 sentences exist
    stats = json.loads((tmp_path / "a" / "split.json").read_text())
    assert stats["pool_rows_dropped_inside_validation_rows"] == 0
    with pytest.raises(UserError, match="only 20 rows that no other row contains.*validation.by: row"):
        split_data(phrases_file, str(tmp_path / "b"), _config(validation={"rows": 30}))


def test_the_rows_no_pool_took_go_to_rest_validation_free_and_every_row_is_accounted_for(tmp_path, phrases_file):
    """rest.jsonl (a student's `layer_texts: rest`): the pool's rows after the labeled and unlabeled ones,
    with none of the validation rows, their copies or (by sentence) their phrases."""
    cfg = _config(validation={"rows": 3, "seed": 0}, labeled_limit=5, unlabeled_rows=4)
    paths = split_data(phrases_file, str(tmp_path / "a"), cfg)
    validation, labeled = _read(paths["validation"]), _read(paths["labeled"])
    unlabeled, rest = _read(paths["unlabeled"]), _read(paths["rest"])
    stats = json.loads((tmp_path / "a" / "split.json").read_text())
    assert stats["rest_rows"] == len(rest) > 0 and all(set(r) == {"text", "label"} for r in rest)
    assert (stats["validation_rows"] + stats["pool_rows_dropped_as_validation_copies"]
            + stats["pool_rows_dropped_inside_validation_rows"] + len(labeled) + len(unlabeled) + len(rest)
            == stats["train_rows"])
    held = [r["text"] for r in validation]
    assert not any(f" {r['text']} " in f" {v} " for r in rest for v in held)  # no phrase of a held-out sentence
    assert not {r["text"] for r in rest} & {r["text"] for r in labeled + unlabeled}
    # all of the pool taken: nothing left
    every = split_data(phrases_file, str(tmp_path / "b"), _config(validation={"rows": 3, "seed": 0},
                                                                   labeled_limit=5, unlabeled_rows=-1))
    assert _read(every["rest"]) == []


def test_lowres_draws_from_the_rows_left_after_validation(tmp_path, train_file):
    cfg = _config(validation={"rows": 10}, lowres={"per_class": 5, "seed": 1})
    paths = split_data(train_file, str(tmp_path / "a"), cfg)
    labeled = _read(paths["labeled"])
    assert sorted(r["label"] for r in labeled) == ["0"] * 5 + ["1"] * 5
    assert not {r["text"] for r in _read(paths["validation"])} & {r["text"] for r in labeled}


def test_without_validation_nothing_is_held_out(tmp_path, train_file):
    paths = split_data(train_file, str(tmp_path / "a"), _config(labeled_limit=20, unlabeled_rows=30))
    assert paths["validation"] is None
    assert len(_read(paths["labeled"])) == 20 and len(_read(paths["unlabeled"])) == 30


def test_more_validation_rows_than_train_is_refused(tmp_path, train_file):
    with pytest.raises(UserError, match="validation.rows = 100, but train has only 60 accepted rows"):
        split_data(train_file, str(tmp_path / "a"), _config(validation={"rows": 100}))
