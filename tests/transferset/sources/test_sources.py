"""transferset/sources (the package): read_source over every format, label inference, rejects summarised, and the
label rule as readers apply it. Each reader's own cases: test_delimited, test_hf, test_parquet; the row rules:
test_records."""
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from source_rows import LABELS, _data_lines, _jsonl, _read
from transferset.contract import schema
from transferset.sources import (Example, Reject, SourceError, SourceSpec, infer_label_names, normalize_text,
                                 parse_label, read_source)


def test_sst2_tsv_rows_are_examples(sst2_dir):
    recs = _read(sst2_dir / "dev.tsv")
    assert len(recs) == 872
    assert all(isinstance(r, Example) for r in recs)
    assert recs[0].text == "one long string of cliches ."
    assert recs[0].label == 0 and recs[0].line == 2
    assert sorted({r.label for r in recs}) == [0, 1]


def test_limit_reads_first_rows(sst2_dir):
    recs = _read(sst2_dir / "train.tsv", limit=7)
    assert len(recs) == 7
    assert recs[0].text == "hide new secretions from the parental units"


def test_each_bad_row_becomes_a_reject_with_reason(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(
        b"sentence\tlabel\n"
        b"a fine film\t1\n"
        b"\t0\n"  # empty text
        b"bad bytes \xff\xfe here\t1\n"  # not UTF-8
        b"a label outside\t7\n"
        b"too many\tfields\there\n"
        + b"x" * 60 + b"\t0\n"  # longer than max_chars
        b"good again\t0\n"
    )
    recs = _read(path, max_chars=50)
    kept = [r for r in recs if isinstance(r, Example)]
    rejects = [r for r in recs if isinstance(r, Reject)]
    assert [r.text for r in kept] == ["a fine film", "good again"]
    reasons = {r.line: r.reason for r in rejects}
    assert reasons[3] == "empty text"
    assert reasons[4] == "bytes that are not valid UTF-8"
    assert "outside the label set" in reasons[5] and "'7'" in reasons[5]
    assert "expected 2 fields" in reasons[6]
    assert "longer than --max-chars" in reasons[7]
    assert len(kept) + len(rejects) == 7  # every row accounted for
    assert all(r.file == str(path) and r.raw for r in rejects)
    assert "\\xff" in rejects[1].raw  # the raw row is kept, bad bytes visible


def test_missing_columns_are_rejected(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("review,stars\ngood,1\n")
    (rej,) = _read(path)
    assert isinstance(rej, Reject) and "missing text column" in rej.reason
    (rej,) = _read(path, text_column="review")
    assert "missing label column 'label'" in rej.reason
    (ok,) = _read(path, text_column="review", label_column="stars")
    assert ok.text == "good" and ok.label == 1


def test_csv_quoting_and_jsonl_and_parquet(tmp_path):
    csv_path = tmp_path / "a.csv"
    csv_path.write_text('text,label\n"hello, ""world""",0\n')
    (ex,) = _read(csv_path)
    assert ex.text == 'hello, "world"'

    jl = tmp_path / "a.jsonl"
    jl.write_text(json.dumps({"text": "one", "label": 1}) + "\n{not json\n" + json.dumps([1, 2]) + "\n")
    recs = _read(jl)
    assert isinstance(recs[0], Example) and recs[0].label == 1
    assert "invalid JSON" in recs[1].reason and recs[1].line == 2
    assert "must be an object" in recs[2].reason

    pq_path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"sentence": ["p one", ""], "label": [1, 0]}), pq_path)
    recs = _read(pq_path)
    assert recs[0].text == "p one" and recs[0].label == 1
    assert recs[1].reason == "empty text" and recs[1].line == 2


def test_sentence_pairs_and_unlabeled(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("q\tp\tlabel\nis it good\tit is good\tentailment\nwhy\t\tneutral\n")
    recs = _read(path, text_column="q", text_b_column="p", label_names=("entailment", "neutral"))
    assert recs[0].text_b == "it is good" and recs[0].label == 0
    assert recs[1].reason == "empty text"
    unl = list(read_source(SourceSpec(path=str(path), text_column="q", label_column=None)))
    assert [r.label for r in unl] == [None, None]


def test_unknown_format_and_label_inference(tmp_path, sst2_dir):
    with pytest.raises(SourceError, match="unknown input format"):
        _read(tmp_path / "x.xlsx")
    assert infer_label_names(str(sst2_dir / "dev.tsv")) == ("0", "1")
    only_ones = tmp_path / "ones.tsv"
    only_ones.write_text("sentence\tlabel\na\t1\nb\t2\n")
    assert infer_label_names(str(only_ones)) == ("0", "1", "2")
    assert parse_label("1", LABELS) == 1 and parse_label("2", LABELS) is None
    assert parse_label(1, ("neg", "pos")) == 1 and parse_label("pos", ("neg", "pos")) == 1
    assert normalize_text("  A  Fine\tFilm ") == "a fine film"


# --- hardening: blank lines, byte order marks, garbage labels and how rejects are reported ------

def test_blank_lines_are_visible_rejects(tmp_path):
    tsv = tmp_path / "blank.tsv"
    tsv.write_text("sentence\tlabel\na\t1\n\nb\t0\n\n")
    recs = _read(tsv)
    assert len(recs) == _data_lines(tsv) == 4
    assert [(r.line, r.reason) for r in recs if isinstance(r, Reject)] == [(3, "blank line"), (5, "blank line")]
    jl = tmp_path / "blank.jsonl"
    jl.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n')
    recs = _read(jl)
    assert [(r.line, r.reason) for r in recs if isinstance(r, Reject)] == [(2, "blank line")]
    assert len(recs) == jl.read_bytes().count(b"\n") == 3


def test_byte_order_mark_is_not_part_of_the_header(tmp_path):
    for name, body in (("bom.tsv", "sentence\tlabel\nwith a bom\t1\n"), ("bom.csv", "sentence,label\nwith a bom,1\n"),
                       ("bom.jsonl", '{"sentence": "with a bom", "label": 1}\n')):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
        (rec,) = _read(path)
        assert isinstance(rec, Example), (name, rec)
        assert (rec.text, rec.label, rec.line) == ("with a bom", 1, 1 if name.endswith("jsonl") else 2)
    bad = tmp_path / "bom_bad.tsv"
    bad.write_bytes(b"\xef\xbb\xbfsentence\tlabel\nbad \xff byte\t1\n")
    (rec,) = _read(bad)
    assert rec.reason == "bytes that are not valid UTF-8"  # surrogateescape still on


def test_inferred_labels_skip_garbage_and_warn_about_rare_ones(tmp_path, caplog):
    objs = [{"text": f"t{i}", "label": i % 2} for i in range(10)]
    objs += [{"text": "f", "label": 1.0}, {"text": "b", "label": True}, {"text": "l", "label": [1]}]
    path = _jsonl(tmp_path / "infer.jsonl", objs)
    with caplog.at_level("INFO", logger="transferset"):
        assert infer_label_names(str(path)) == ("0", "1")
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "'0': 5 rows" in messages and "'1': 5 rows" in messages
    assert "ignored 3 label value(s)" in messages and "line 11" in messages

    caplog.clear()
    stray = tmp_path / "stray.tsv"
    stray.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{i % 2}\n" for i in range(20)) + "odd one\t2\n")
    with caplog.at_level("INFO", logger="transferset"):
        assert infer_label_names(str(stray)) == ("0", "1", "2")
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "label '2' has only 1 row (line 22)" in warning.getMessage()
    assert "--labels" in warning.getMessage()


def test_summarize_rejects_names_file_reasons_and_flags(tmp_path):
    from transferset.sources import summarize_rejects

    rejects = [Reject("dev.tsv", i, "", f"missing text column 'sentence' (use --text-column) #{i}")
               for i in range(2, 10)]
    msg = summarize_rejects("dev.tsv", rejects)
    assert msg.startswith("dev.tsv: every row was rejected (8 rows).")
    assert "line 2: missing text column 'sentence' (use --text-column) #2" in msg
    assert "line 6:" in msg and "line 7:" not in msg and "3 more" in msg
    assert "--text-column" in msg and "--label-column" in msg and "--labels" in msg


def test_read_split_reports_rejects_as_a_user_error(tmp_path):
    from transferset.config import TeacherConfig
    from transferset.runtime.errors import UserError
    from transferset.teacher.train import read_split

    dev = tmp_path / "dev.tsv"
    dev.write_text("review\tlabel\ngood\t1\nbad\t0\n")
    cfg = TeacherConfig()
    with pytest.raises(UserError) as info:
        read_split(str(dev), cfg, ("0", "1"))
    msg = str(info.value)
    assert msg.startswith(f"{dev}: every row was rejected (2 rows).")
    assert "line 2: missing text column 'sentence or text'" in msg and "line 3:" in msg


# --- the label rule (transferset.contract.labels) ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["tsv", "csv"])
def test_float_like_and_negative_labels_are_rejects_that_shift_no_class(tmp_path, sst2_dir, head_tsv, fmt):
    """In TSV, `1.0` and `-1` became classes and SST-2's `1` became class 2."""
    rows = (sst2_dir / "train.tsv").read_text(encoding="utf-8").splitlines()[1:21]
    sep = "\t" if fmt == "tsv" else ","
    lines = [r.replace(",", " ").replace("\t", sep) for r in rows]
    path = tmp_path / f"sst2.{fmt}"
    path.write_text(f"sentence{sep}label\n" + "\n".join(lines[:10] + [f"a float{sep}1.0", f"a negative{sep}-1",
                                                                     f"an exponent{sep}1e0", f"not a number{sep}nan"]
                                                          + lines[10:]) + "\n")
    assert infer_label_names(str(path)) == ("0", "1")
    recs = _read(path)
    assert len(recs) == 24
    kept = [r for r in recs if isinstance(r, Example)]
    assert [r.label for r in kept] == [int(r.rsplit(sep, 1)[1]) for r in lines]  # SST-2's 1 stays class 1
    reasons = {r.line: r.reason for r in recs if isinstance(r, Reject)}
    assert reasons == {
        12: "label '1.0' is a number that is not a class index; labels must be names or integer class indices (0..999)",
        13: "label '-1' is a negative number; labels must be names or integer class indices (0..999)",
        14: "label '1e0' is a number that is not a class index; labels must be names or integer class indices (0..999)",
        15: "label 'nan' is a number that is not a class index; labels must be names or integer class indices (0..999)",
    }


def test_huge_integer_labels_never_build_a_label_set(tmp_path, caplog):
    """A JSONL label 10**30 drove augment to 23 GB; a TSV label 20000000 made evaluate run 11 minutes."""
    jl = _jsonl(tmp_path / "huge.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 10**30},
                                         {"text": "c", "label": 1}, {"text": "d", "label": "9" * 5000}])
    tsv = tmp_path / "huge.tsv"
    tsv.write_text("sentence\tlabel\na\t0\nb\t20000000\nc\t1\nd\t999\n")
    pq_path = tmp_path / "huge.parquet"
    pq.write_table(pa.table({"sentence": ["a", "b", "c"], "label": pa.array([0, 2**62, 1], pa.int64())}), pq_path)
    with caplog.at_level("WARNING", logger="transferset"):
        assert infer_label_names(str(jl)) == ("0", "1")
        assert infer_label_names(str(pq_path)) == ("0", "1")
        assert len(infer_label_names(str(tsv))) == 1000  # 999 is the largest class index there can be
    assert "ignored 2 label value(s)" in caplog.text and "line 2: label 1000000000000000000000000000000 is not " \
        "a class index: at most 1000 classes (0..999)" in caplog.text
    recs = _read(jl)
    assert [type(r).__name__ for r in recs] == ["Example", "Reject", "Example", "Reject"]
    assert recs[3].reason.startswith("label '9999") and recs[3].reason.endswith(
        "(5,002 characters) is not a class index: at most 1000 classes (0..999)")
    assert _read(pq_path)[1].reason == "label 4611686018427387904 is not a class index: at most 1000 classes (0..999)"


def test_more_distinct_labels_than_a_set_may_hold_is_one_error(tmp_path):
    path = tmp_path / "ids.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\tname{i}\n" for i in range(1001)))
    with pytest.raises(SourceError, match=r"ids.tsv, line 1002: more than 1000 distinct values in label column "
                                          r"'label' \(a classification label set holds at most 1000\)"):
        infer_label_names(str(path))


@pytest.mark.parametrize("stage", ["AugmentConfig", "TeacherConfig"])
@pytest.mark.parametrize("labels, says", [
    (",".join(str(i) for i in range(5001)), "5,001 labels, more than the 1000 a transfer set may hold"),
    ("0,1.0", "label '1.0' is a number that is not a class index"),
    ("neg,-1", "label '-1' is a negative number"),
    ("neg,pos,neg", "label 'neg' is named twice"),
    ("1,01", "label '01' is named twice"),  # 01 is 1
])
def test_teacher_and_augment_refuse_the_same_label_sets(stage, labels, says):
    """`teacher` accepted a 5,001-class label set that `augment` refused: one rule for --labels now."""
    from transferset import config
    from transferset.runtime import typed
    from transferset.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        typed.load(getattr(config, stage), {"labels": labels}, where="--labels")
    assert typed.load(getattr(config, stage), {"labels": "neg,pos"}, where="--labels").labels == ("neg", "pos")


def test_a_rejects_raw_field_is_the_line_as_written(tmp_path):
    """A reject's `raw` is the whole row as written, as the docs promise, not a JSON rebuild of the parsed row."""
    tsv = tmp_path / "in.tsv"
    tsv.write_text("sentence\tlabel\nfine\t1\na label outside\t7\n", encoding="utf-8")
    csv_path = tmp_path / "in.csv"
    csv_path.write_text('sentence,label\n"quoted, with a comma",7\r\n', encoding="utf-8")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "ok", "label": "1"}\n{ "text" : "spaced",   "label": 7 }\n', encoding="utf-8")
    for path, line in ((tsv, "a label outside\t7"), (csv_path, '"quoted, with a comma",7'),
                       (jsonl, '{ "text" : "spaced",   "label": 7 }')):
        (reject,) = [r for r in _read(path) if isinstance(r, Reject)]
        assert reject.raw == line and "outside the label set" in reject.reason, (path, reject)
        assert reject.to_dict()[schema.REJECT_RAW] == line
    # Rows without a line of text (Parquet, hf:) keep their values as JSON.
    pq.write_table(pa.table({"sentence": ["x"], "label": ["7"]}), tmp_path / "in.parquet")
    (reject,) = _read(tmp_path / "in.parquet")
    assert json.loads(reject.raw) == {"sentence": "x", "label": "7"}
