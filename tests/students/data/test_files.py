"""students/data/files.py: a saved student's JSON file that is damaged, or holds another kind of value than an
object, is one StudentFileError naming the file, what it holds, and what to do."""
import json

import pytest

from students.data.files import StudentFileError, json_phrase, read_json_object
from transferset.runtime.errors import UserError


def test_an_object_is_read_back(tmp_path):
    path = tmp_path / "sidecar.json"
    path.write_text(json.dumps({"family": "bilstm", "labels": ["neg", "pos"]}))
    assert read_json_object(str(path), holds="the settings", remedy="train again") == {
        "family": "bilstm", "labels": ["neg", "pos"]}


@pytest.mark.parametrize("content, says", [
    ("[1, 2]", "holds a JSON list, not an object ([1, 2]; the settings); train again"),
    ('"text"', "holds a JSON string, not an object"),
    ("null", "holds JSON null, not an object"),
    ("{oops", "not a JSON file ("),
    (b"\xff\xfe", "not a JSON file ("),
])
def test_anything_else_is_one_message_naming_the_file(tmp_path, content, says):
    path = tmp_path / "sidecar.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StudentFileError) as exc:
        read_json_object(str(path), holds="the settings", remedy="train again")
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and says in message and message.endswith("train again")
    assert isinstance(exc.value, UserError)  # the CLI turns it into one line, exit 1


def test_a_missing_file_is_the_same_error(tmp_path):
    with pytest.raises(StudentFileError, match="missing.json: not a JSON file"):
        read_json_object(str(tmp_path / "missing.json"), holds="the settings", remedy="train again")


def test_json_phrase_names_each_kind():
    # (an object is what these files should hold: it is never the phrase for what they hold instead)
    assert [json_phrase(v) for v in ([], "x", True, 3, 1.5, None)] == [
        "a JSON list", "a JSON string", "a JSON boolean", "a JSON number", "a JSON number", "JSON null"]
