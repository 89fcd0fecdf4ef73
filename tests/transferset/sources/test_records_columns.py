"""A column named twice is refused when the file is opened (TSV/CSV header, Parquet schema), and a JSON line
that repeats a key is a reject: which of the two values is the text or the label is never a silent choice."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from source_rows import _read
from transferset.runtime.errors import ConfigError
from transferset.sources import Example, Reject, SourceError, check_readable, infer_label_names
from transferset.sources.delimited import header
from transferset.sources.records import local_open


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_a_header_that_names_a_column_twice_is_refused(tmp_path, suffix, sep):
    path = tmp_path / f"train{suffix}"
    path.write_text(sep.join(["text", "label", "text"]) + "\n" + sep.join(["first", "1", "second"]) + "\n")
    for read in (lambda: _read(path), lambda: check_readable(str(path)), lambda: header(str(path), suffix[1:], local_open)):
        with pytest.raises(ConfigError) as exc:  # a usage error: the CLI exits 2
            read()
        assert isinstance(exc.value, SourceError)
        assert str(exc.value) == (f"{path}, line 1: the header names the column 'text' more than once (text, label, "
                                  "text); rename or drop the copies so that each column name is unique")


def test_the_header_alone_is_read_without_rows(tmp_path):
    path = tmp_path / "only.csv"
    path.write_text("text,label\n")
    assert header(str(path), "csv", local_open) == ["text", "label"]
    (tmp_path / "empty.csv").write_text("")
    assert header(str(tmp_path / "empty.csv"), "csv", local_open) == []


def test_a_parquet_schema_that_names_a_column_twice_is_refused(tmp_path):
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["1"]), pa.array(["b"])], names=["text", "label", "text"])
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    with pytest.raises(ConfigError, match="its schema names the column 'text' more than once"):
        _read(path)


def test_a_json_line_that_repeats_a_key_is_a_reject_with_its_reason(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "kept", "label": 1}\n{"text": "one", "label": 0, "text": "two"}\n'
                    + json.dumps({"text": "nested is fine", "label": 1, "meta": {"a": 1}}) + "\n"
                    + '{"text": "deep", "label": 1, "meta": {"a": 1, "a": 2}}\n')
    recs = _read(path)
    assert [type(r) for r in recs] == [Example, Reject, Example, Example]  # only the row's own keys count
    assert recs[1].line == 2 and recs[1].reason == ("the key 'text' appears more than once in the object: which "
                                                    "value is meant is unclear")


def test_a_header_without_rows_has_no_label_set_to_infer_and_says_so(tmp_path):
    path = tmp_path / "only.csv"
    path.write_text("text,label\n")
    with pytest.raises(SourceError, match="only.csv has no data rows \\(a header at most\\)"):
        infer_label_names(str(path))
