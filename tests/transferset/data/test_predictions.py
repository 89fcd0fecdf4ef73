"""transferset/data/predictions.py: the rows `transferset predict` writes, its settings, and the row count it
checks the readers against."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError, UserError
from transferset.sources import Example, SourceSpec, read_source


@pytest.mark.parametrize("name, content", [
    ("a.tsv", "sentence\nfine\n\nlast without newline"),
    ("b.tsv", "sentence\tlabel\nok\t1\nbad \"quote\t0\ntoo\tmany\tfields\n\n"),
    ("c.csv", 'sentence\n"multi\nline"\nok\n"open quote\n'),
    ("d.jsonl", '{"text": "a"}\n\n{broken\n[1]\n{"text": "b"}'),
    ("e.tsv", "sentence\n"),
    ("f.tsv", ""),
    ("g.tsv", "sentence\na bare\rcarriage return\nx\r\n"),
])
def test_count_lines_is_the_number_of_rows_the_readers_yield(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8"))
    read = list(read_source(SourceSpec(path=str(path), label_column=None)))
    assert predictions.count_lines(str(path)) == len(read)
    assert len(read) > 0 or name in ("e.tsv", "f.tsv")  # the files with no rows


def test_count_lines_of_parquet_and_hf(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None]}), path)
    assert predictions.count_lines(str(path)) == 3 == len(list(read_source(SourceSpec(path=str(path), label_column=None))))
    assert predictions.count_lines("hf:glue:sst2:validation") is None  # not counted (not even loaded)


def test_rows_and_schema():
    examples = [Example("id1", "a film", None, None, "f", 2), Example("id2", "dull", "b", None, "f", 3)]
    probs = np.array([[0.25, 0.75], [0.9, 0.1]], dtype=np.float32)
    rows = predictions.rows_of(examples, ["pos", "neg"], probs, ["neg", "pos"], pairs=True)
    assert rows[1] == {"id": predictions.row_id("f", 3, "dull", "b"), "file": "f", "line": 3, "source_id": "id2",
                       "text": "dull", "text_b": "b", "predicted_label": "neg",
                       "prob_neg": pytest.approx(0.9), "prob_pos": pytest.approx(0.1)}
    sch = predictions.output_schema(["neg", "pos"], pairs=True, model="m")
    table = pa.Table.from_pylist(rows, schema=sch)
    assert table.schema.names == ["id", "file", "line", "source_id", "text", "text_b", "predicted_label", "prob_neg",
                                  "prob_pos"]
    assert list(rows[0]) == table.schema.names  # JSON lines keep the Parquet column order
    assert table.schema.field("prob_pos").type == pa.float32() and table.schema.field("line").type == pa.int64()
    assert schema.decode_metadata(sch.metadata)[schema.META_LABEL_NAMES] == ["neg", "pos"]
    assert json.loads(sch.metadata[schema.META_MODEL.encode()]) == "m"
    assert predictions.output_schema(["a", "b"], pairs=False).names == ["id", "file", "line", "source_id", "text",
                                                                        "predicted_label", "prob_a", "prob_b"]
    # On Beam the rows travel as input_rows keyed by their id: the same output rows.
    key, value = predictions.keyed_input_row(examples[0])
    assert key == rows[0]["id"] and predictions.rows_of([value], ["pos"], probs[:1], ["neg", "pos"], pairs=True) == rows[:1]


def test_every_row_says_where_it_was_read_and_has_an_id_of_its_own(tmp_path):
    """Each row records the file and line it was read from and has an id of its own, not a hash of the text
    alone: a sentence repeated in a file or across inputs gives rows told apart (source_id still joins them)."""
    a, b = tmp_path / "a.tsv", tmp_path / "b.jsonl"
    a.write_text("sentence\nthe same sentence\nanother one\nthe same sentence\n")
    b.write_text(json.dumps({"text": "the same sentence"}) + "\n\n" + json.dumps({"text": "the same sentence"}) + "\n")
    examples = [e for p in (a, b) for e in read_source(SourceSpec(path=str(p), label_column=None))
                if isinstance(e, Example)]
    probs = np.full((len(examples), 2), 0.5, dtype=np.float32)
    rows = predictions.rows_of(examples, ["x"] * len(examples), probs, ["x", "y"], pairs=False)
    where = [(r["file"], r["line"]) for r in rows]
    assert where == [(str(a), 2), (str(a), 3), (str(a), 4), (str(b), 1), (str(b), 3)]
    for r in rows:  # the line holds the row's text
        path = r["file"]
        line = open(path, encoding="utf-8").read().split("\n")[r["line"] - 1]
        assert r["text"] in line
    assert len({r["id"] for r in rows}) == 5  # one id per input row
    same = [r for r in rows if r["text"] == "the same sentence"]
    assert len(same) == 4 and len({r["source_id"] for r in same}) == 1  # the content id still joins them
    # Stable: the same inputs give the same ids (in another run, on Beam: the id depends on nothing else).
    again = [e for p in (a, b) for e in read_source(SourceSpec(path=str(p), label_column=None)) if isinstance(e, Example)]
    assert [predictions.input_row(e)["id"] for e in again] == [r["id"] for r in rows]
    # The text is part of it: a line edited between two runs does not keep the old row's id.
    assert predictions.row_id("f", 2, "x", None) != predictions.row_id("f", 2, "y", None)
    assert predictions.row_id("f", 2, "x", None) != predictions.row_id("f", 2, "x", "")


def test_settings_are_checked():
    assert typed.load(PredictConfig, {"format": "jsonl", "beam_above": 5}, "flags") == \
        PredictConfig(format="jsonl", beam_above=5)
    for bad, message in (({"format": "xml"}, r"format = 'xml': input should be 'parquet' or 'jsonl'"),
                         ({"batch_size": 0}, r"batch_size = 0: input should be greater than or equal to 1 \(expected int\)"),
                         ({"threads": 0}, "threads = 0: input should be greater than or equal to 1"),
                         ({"beam": True}, "beam")):
        with pytest.raises(ConfigError, match=message):
            typed.load(PredictConfig, bad, "flags")
    with pytest.raises(UserError, match="repeat a name"):
        predictions.check_label_names(["a", "a"])


def test_reconcile():
    ok = {"input_rows": 5, "predicted": 3, "rejected": 2, "input_lines": 5}
    assert predictions.reconcile(ok) == [] and predictions.reconcile({**ok, "input_lines": None}) == []
    assert predictions.reconcile({**ok, "predicted": 2}) == ["input_rows 5 != predicted 2 + rejected 2"]
