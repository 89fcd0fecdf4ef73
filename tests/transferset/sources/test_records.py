"""transferset/sources/records.py: the rules that turn one parsed row into an Example or a Reject (its source id,
its label, its text), whatever the format."""
import json

from source_rows import LABELS, _jsonl, _read
from transferset.sources import Example, infer_label_names, parse_label


def test_source_id_depends_on_content_only(tmp_path):
    a = tmp_path / "a.tsv"
    b = tmp_path / "b.tsv"
    a.write_text("sentence\tlabel\nsame text\t0\nother\t1\n")
    b.write_text("sentence\tlabel\nother\t1\nsame text\t0\n")
    ids_a = {r.text: r.source_id for r in _read(a)}
    ids_b = {r.text: r.source_id for r in _read(b)}
    assert ids_a == ids_b and len(set(ids_a.values())) == 2


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
