"""pipelines/predict.py: the Beam graph of `transferset predict`, with a stand-in model (a rule on the text),
so the pipeline is tested without students (tests/students/test_predict_files.py runs real students)."""
import json
from collections import namedtuple
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines import predict
from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.runtime.errors import UserError
from transferset.sources import source_id_for

Out = namedtuple("Out", "labels probabilities label_names")
LABELS = ("neg", "pos")


class RuleModel:
    """P(pos) grows with the text's length: a model whose outputs differ by row."""

    label_names = list(LABELS)

    def __init__(self):
        self.batches = []

    def predict(self, texts, texts_b=None, batch_size=256):
        self.batches.append(len(texts))
        n = np.array([len(t) + len(b or "") for t, b in zip(texts, texts_b or [None] * len(texts))], dtype=np.float32)
        p = (n / (n + 20.0)).astype(np.float32)
        probs = np.stack([1 - p, p], 1)
        return Out([LABELS[int(x > 0.5)] for x in p], probs, list(LABELS))


def load_rule_model(path: str) -> RuleModel:
    assert path == "rule-model"
    return RuleModel()


def expected(text: str, text_b=None) -> float:
    n = len(text) + len(text_b or "")
    return n / (n + 20.0)


def job(inputs, output, **settings) -> predict.PredictJob:
    return predict.PredictJob(model="rule-model", loader=load_rule_model, label_names=LABELS, inputs=tuple(map(str, inputs)),
                              output=str(output), cfg=PredictConfig(**settings))


def run(j):
    with beam.Pipeline(runner="FnApiRunner") as p:
        predict.build(p, j)
    return json.loads((Path(j.output) / schema.STATS_FILE).read_text())


@pytest.fixture
def files(tmp_path):
    a = tmp_path / "a.tsv"
    a.write_text("sentence\tother\nshort\tx\na much longer sentence here\ty\n\nbad\trow\textra\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"text": "medium text"}) + "\n{broken\n")
    return a, b


def test_rows_rejects_and_stats(files, tmp_path):
    out = tmp_path / "out"
    stats = run(job(files, out))
    rows = [r for f in sorted((out / schema.DATA_DIR).iterdir()) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["text"] for r in rows) == ["a much longer sentence here", "medium text", "short"]
    for r in rows:
        assert r["source_id"] == source_id_for(r["text"], None)
        assert r["id"] == predictions.row_id(r["file"], r["line"], r["text"], None)
        assert r["prob_pos"] == pytest.approx(expected(r["text"]), abs=1e-6)
        assert r["predicted_label"] == ("pos" if r["prob_pos"] > 0.5 else "neg")
        assert list(r) == ["id", "file", "line", "source_id", "text", "predicted_label", "prob_neg", "prob_pos"]
    assert sorted((r["file"], r["line"], r["text"]) for r in rows) == [
        (str(files[0]), 2, "short"), (str(files[0]), 3, "a much longer sentence here"), (str(files[1]), 1, "medium text")]
    assert {r["text"]: r["predicted_label"] for r in rows}["short"] == "neg"
    rejects = [json.loads(x) for f in (out / schema.REJECTS_DIR).iterdir() for x in f.read_text().splitlines()]
    assert sorted(r[schema.REJECT_REASON].split(":")[0] for r in rejects) == [
        "blank line", "expected 2 fields as in the header, found 3", "invalid JSON"]
    assert (stats["input_rows"], stats["predicted"], stats["rejected"]) == (6, 3, 3)
    assert stats["inputs"] == {str(files[0]): {"predicted": 2, "rejected": 2},
                               str(files[1]): {"predicted": 1, "rejected": 1}}
    assert stats["problems"] == [] and (out / schema.COMPLETE_MARKER).exists()
    sch = pq.read_schema(next((out / schema.DATA_DIR).iterdir()))
    assert json.loads(sch.metadata[schema.META_LABEL_NAMES.encode()]) == list(LABELS)


def test_pairs_as_jsonl(tmp_path):
    src = tmp_path / "pairs.csv"
    src.write_text("a,b\nfirst,second one\nx,\n")
    out = tmp_path / "out"
    stats = run(job([src], out, format="jsonl", text_column="a", text_b_column="b"))
    rows = [json.loads(x) for f in (out / schema.DATA_DIR).iterdir() for x in f.read_text().splitlines()]
    assert rows == [{"id": predictions.row_id(str(src), 2, "first", "second one"), "file": str(src), "line": 2,
                     "source_id": source_id_for("first", "second one"), "text": "first", "text_b": "second one",
                     "predicted_label": "neg", "prob_neg": pytest.approx(1 - expected("first", "second one")),
                     "prob_pos": pytest.approx(expected("first", "second one"))}]
    assert stats["rejected"] == 1  # an empty second text is rejected, as augment rejects it


def test_repeated_sentences_keep_their_own_rows_ids_and_lines(tmp_path):
    """Each row has its own id, not the text's hash (which gave 614 rows 317 distinct ids), and says which file
    and line it came from; the same text keeps one source_id and the rule's probabilities."""
    a, b = tmp_path / "a.tsv", tmp_path / "b.csv"
    a.write_text("sentence\nsame words\nother words\nsame words\n")
    b.write_text("sentence\nsame words\n")
    out = tmp_path / "out"
    stats = run(job([a, b], out))
    rows = sorted((r for f in (out / schema.DATA_DIR).iterdir() for r in pq.read_table(f).to_pylist()),
                  key=lambda r: (r["file"], r["line"]))
    assert [(r["file"], r["line"], r["text"]) for r in rows] == [
        (str(a), 2, "same words"), (str(a), 3, "other words"), (str(a), 4, "same words"), (str(b), 2, "same words")]
    assert len({r["id"] for r in rows}) == 4 and stats["predicted"] == 4
    assert len({r["source_id"] for r in rows if r["text"] == "same words"}) == 1
    assert all(r["prob_pos"] == pytest.approx(expected(r["text"]), abs=1e-6) for r in rows)


def test_an_input_whose_every_row_is_rejected_fails_the_run(files, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"(?s)a\.tsv: every row was rejected \(4 rows\).*missing text column"):
        predict.run_predict(job(files[:1], out, text_column="review"))
    assert not (out / schema.COMPLETE_MARKER).exists()
    stats = json.loads((out / schema.STATS_FILE).read_text())
    assert stats["predicted"] == 0 and stats["rejected"] == 4


def test_a_lines_count_that_does_not_add_up_is_a_problem():
    stats = {"input_rows": 5, "predicted": 3, "rejected": 2, "input_lines": 6}
    assert predictions.reconcile(stats) == ["the inputs have 6 rows (lines) but 5 were read"]
