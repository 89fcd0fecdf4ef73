import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transferset.sources import (Example, Reject, SourceError, SourceSpec, infer_label_names, normalize_text,
                                 parse_hf_spec, parse_label, read_source)
from transferset import schema

LABELS = ("0", "1")


def _read(path, **kw):
    kw.setdefault("label_names", LABELS)
    return list(read_source(SourceSpec(path=str(path), **kw)))


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


def test_hf_dataset_spec_reads_through_datasets(tmp_path):
    d = tmp_path / "local_ds"
    d.mkdir()
    (d / "train.csv").write_text("sentence,label\nfrom the hub,1\n,0\n")
    recs = list(read_source(SourceSpec(path=f"hf:{d}:train", label_names=LABELS)))
    assert recs[0].text == "from the hub" and recs[0].label == 1
    assert recs[1].reason == "empty text"
    assert parse_hf_spec("hf:glue:sst2:validation") == ("glue", "sst2", "validation")
    assert parse_hf_spec("hf:imdb:test") == ("imdb", None, "test")


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


def test_source_id_depends_on_content_only(tmp_path):
    a = tmp_path / "a.tsv"
    b = tmp_path / "b.tsv"
    a.write_text("sentence\tlabel\nsame text\t0\nother\t1\n")
    b.write_text("sentence\tlabel\nother\t1\nsame text\t0\n")
    ids_a = {r.text: r.source_id for r in _read(a)}
    ids_b = {r.text: r.source_id for r in _read(b)}
    assert ids_a == ids_b and len(set(ids_a.values())) == 2


# --- hardening (issue #12) ----------------------------------------------------------------------

def _data_lines(path) -> int:
    """What `wc -l` says minus the header: every physical data line must become one record."""
    return path.read_bytes().count(b"\n") - 1


def _sst2_csv(sst2_dir, dst, n):
    """The header and first n rows of the real SST-2 dev set, written as CSV (test-local copy)."""
    import csv

    with open(sst2_dir / "dev.tsv", encoding="utf-8") as fh:
        rows = [line.rstrip("\n").split("\t") for line in fh][: n + 1]
    with open(dst, "w", encoding="utf-8", newline="") as out:
        csv.writer(out, lineterminator="\n").writerows(rows)
    return rows


def test_unbalanced_quote_rejects_its_line_and_reading_resumes(tmp_path, sst2_dir):
    path = tmp_path / "quote.csv"
    rows = _sst2_csv(sst2_dir, path, 51)
    lines = path.read_text(encoding="utf-8").split("\n")
    # Line 22 opens a quote that never closes; later lines quote their commas, as csv.writer does.
    lines[21] = '"an unclosed quote,1'
    assert sum('"' in line for line in lines[22:]) >= 2
    path.write_text("\n".join(lines), encoding="utf-8")
    recs = _read(path)
    assert len(recs) == _data_lines(path) == 51
    rejects = [r for r in recs if isinstance(r, Reject)]
    assert [r.line for r in rejects] == [22]
    assert rejects[0].reason.startswith("unbalanced quote or embedded newline spanning lines 22-")
    assert "line 22" in rejects[0].reason and "resumes at line 23" in rejects[0].reason
    kept = [r for r in recs if isinstance(r, Example)]
    assert len(kept) == 50 and kept[-1].line == 52 and kept[-1].text == rows[51][0]


def test_multi_line_record_is_one_reject_per_physical_line(tmp_path):
    path = tmp_path / "embedded.csv"
    path.write_text('text,label\ngood,1\n"two\nlines",0\nafter,1\n')
    recs = _read(path)
    assert len(recs) == _data_lines(path) == 4
    assert [(type(r).__name__, r.line) for r in recs] == [("Example", 2), ("Reject", 3), ("Reject", 4),
                                                          ("Example", 5)]
    assert all(r.reason.startswith("unbalanced quote or embedded newline spanning lines 3-4")
               for r in recs[1:3])
    assert [r.text for r in recs if isinstance(r, Example)] == ["good", "after"]


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


def _jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def test_label_types_other_than_names_and_integers_are_rejected(tmp_path):
    path = _jsonl(tmp_path / "labels.jsonl", [
        {"text": "int", "label": 1}, {"text": "name", "label": "0"}, {"text": "float", "label": 1.0},
        {"text": "bool", "label": True}, {"text": "list", "label": [1]}, {"text": "dict", "label": {"y": 1}},
    ])
    recs = _read(path)
    assert [r.label for r in recs[:2]] == [1, 0]
    reasons = [r.reason for r in recs[2:]]
    assert reasons[0] == "label 1.0 is a float; labels must be names or integer class indices"
    assert reasons[1] == "label True is a boolean; labels must be names or integer class indices"
    assert reasons[2] == "label [1] is a list; labels must be names or integer class indices"
    assert reasons[3] == "label {'y': 1} is a dict; labels must be names or integer class indices"
    assert parse_label(1.0, LABELS) is None and parse_label([1], LABELS) is None and parse_label(True, LABELS) is None


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


def test_non_string_text_is_rejected(tmp_path):
    path = _jsonl(tmp_path / "text.jsonl", [
        {"text": 12345, "label": 1}, {"text": {"a": 1}, "label": 1}, {"text": ["a"], "label": 1},
        {"text": "fine", "label": 1}, {"text": "pair", "b": 7, "label": 0},
    ])
    recs = _read(path)
    assert [r.reason for r in recs[:3]] == ["text must be a string, found int",
                                           "text must be a string, found dict",
                                           "text must be a string, found list"]
    assert recs[3].text == "fine"
    recs = _read(path, text_b_column="b")
    assert recs[4].reason == "text_b must be a string, found int"


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
    from transferset.errors import UserError
    from transferset.config import TeacherConfig
    from transferset.teacher.train import read_split

    dev = tmp_path / "dev.tsv"
    dev.write_text("review\tlabel\ngood\t1\nbad\t0\n")
    cfg = TeacherConfig()
    with pytest.raises(UserError) as info:
        read_split(str(dev), cfg, ("0", "1"))
    msg = str(info.value)
    assert msg.startswith(f"{dev}: every row was rejected (2 rows).")
    assert "line 2: missing text column 'sentence or text'" in msg and "line 3:" in msg


def test_lone_surrogate_is_a_reject_naming_its_position_and_reading_goes_on(tmp_path):
    """A JSON escape of half a surrogate pair decodes to a str that has no UTF-8: a bad row, not a crash."""
    path = tmp_path / "lone.jsonl"
    path.write_text('{"text": "\\ud83d lone", "label": "1"}\n'
                    '{"text": "ab\\udfff", "label": "0"}\n'
                    '{"text": "\\udcff escaped byte", "label": "0"}\n'
                    '{"text": "a pair \\ud83d\\ude00 is fine", "label": "\\ud83d"}\n'
                    '{"text": "last one", "label": "0"}\n', encoding="utf-8")
    recs = _read(path)
    assert [type(r).__name__ for r in recs] == ["Reject", "Reject", "Reject", "Reject", "Example"]
    assert recs[0].reason == "text is not valid Unicode (lone surrogate at char 1)"
    assert recs[1].reason == "text is not valid Unicode (lone surrogate at char 3)"
    assert recs[2].reason == "text is not valid Unicode (lone surrogate at char 1)"
    assert recs[3].reason == "label '\\ud83d' is not valid Unicode"  # a label name must be storable too
    for r in recs[:4]:  # every reject record is writable as UTF-8 JSON (the rejects files)
        json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")
    assert "\\ud83d lone" in recs[0].raw
    unlabeled = _read(path, label_column=None)
    assert sum(isinstance(r, Example) for r in unlabeled) == 2  # the pair and the last row
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"text": "fine", "text_b": "ab\\udfff", "label": "0"}\n', encoding="utf-8")
    assert _read(pairs, text_b_column="text_b")[0].reason == "text_b is not valid Unicode (lone surrogate at char 3)"
    # The label set is never inferred from a value that cannot be written.
    assert infer_label_names(str(path)) == ("0", "1")


def test_parquet_strings_that_are_not_utf8_are_rejects(tmp_path):
    texts = pa.array([b"good one", b"bad \xff byte", b"\xed\xa0\xbd encoded surrogate", b"good two"]).view(pa.string())
    path = tmp_path / "bytes.parquet"
    pq.write_table(pa.table({"sentence": texts, "label": ["0", "1", "0", "1"]}), path)
    recs = _read(path)
    assert [isinstance(r, Example) for r in recs] == [True, False, False, True]
    assert [r.line for r in recs] == [1, 2, 3, 4]
    assert recs[1].reason == recs[2].reason == "bytes that are not valid UTF-8"
    assert "\\xff" in recs[1].raw
    not_parquet = tmp_path / "random.parquet"
    not_parquet.write_bytes(b"PAR1 not really")
    with pytest.raises(SourceError, match="random.parquet: not a readable Parquet file"):
        _read(not_parquet)


def test_a_carriage_return_inside_a_line_does_not_split_it(tmp_path):
    """Lines end at \\n, as `wc -l` counts them: one stray \\r is one reject, not two rows."""
    path = tmp_path / "cr.tsv"
    path.write_bytes(b"sentence\tlabel\r\nfine\t1\r\nbroken \r line\t0\nlast\t0")
    recs = _read(path)
    assert [r.line for r in recs] == [2, 3, 4]
    assert [isinstance(r, Example) for r in recs] == [True, False, True]
    assert recs[1].reason == "a carriage return (\\r) inside the line: not a TSV row"


@pytest.fixture
def hub_offline(monkeypatch):
    """The Hugging Face Hub unreachable at once, as on a machine without network (no 25 s of retries)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_an_unknown_hf_dataset_offline_is_one_message(hub_offline):
    """Issue 25 item 9: an unknown dataset offline was a ConnectionError traceback. Issue 42 item 7: after 25 s of
    retries; now at once, a usage error (exit 2), whoever reads it first."""
    from transferset.errors import ConfigError
    from transferset.sources import check_readable

    for call in (lambda p: check_readable(p), lambda p: list(read_source(SourceSpec(path=p, label_names=LABELS))),
                 infer_label_names):
        with pytest.raises(SourceError, match=r"^hf:nosuch-user/nosuch-set:train: the dataset nosuch-user/nosuch-set: "
                                              r"not a local folder, and HF_HUB_OFFLINE is set with no copy of it in "
                                              r"the Hugging Face cache: give a local folder of the dataset's files, or "
                                              r"unset HF_HUB_OFFLINE on a machine with network$") as err:
            call("hf:nosuch-user/nosuch-set:train")
        assert isinstance(err.value, ConfigError)


def test_an_hf_folder_of_files_that_are_not_utf8_is_one_message(tmp_path, hub_offline):
    """Issue 25 item 9: `hf:` on a folder of non-UTF-8 files was a UnicodeDecodeError traceback."""
    from transferset.sources import check_readable

    d = tmp_path / "latin1"
    d.mkdir()
    (d / "train.csv").write_bytes("sentence,label\nun café noir,1\n".encode("latin-1"))
    for call in (lambda p: check_readable(p), lambda p: list(read_source(SourceSpec(path=p, label_names=LABELS)))):
        with pytest.raises(SourceError, match=rf"^hf:{re.escape(str(d))}:train: the files of .* are not UTF-8 text "
                                              r"\('utf-8' codec can't decode byte 0xe9"):
            call(f"hf:{d}:train")
    with pytest.raises(SourceError, match=r"empty: no such folder \(hf:PATH:SPLIT reads a local folder"):
        check_readable(f"hf:{tmp_path / 'empty'}:nosuch")  # issue 42: said "split 'nosuch'" after `datasets` tried
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"split 'nosuch'"):
        check_readable(f"hf:{tmp_path / 'empty'}:nosuch")


# --- the label rule (transferset.labels): issue 25 item 4 ------------------------------------------------

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
    from transferset import config, typed
    from transferset.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        typed.load(getattr(config, stage), {"labels": labels}, where="--labels")
    assert typed.load(getattr(config, stage), {"labels": "neg,pos"}, where="--labels").labels == ("neg", "pos")


def test_a_rejects_raw_field_is_the_line_as_written(tmp_path):
    """Issue 42 item 9: `raw` was a JSON rebuild of the parsed row; the docs promise the whole row as written."""
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
