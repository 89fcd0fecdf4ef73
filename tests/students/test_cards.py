"""Model cards (transferset/card.py): a student saved by `transferset train` has one written from its records,
and `transferset export` keeps it in the export folder with what the export changed. (A run's cards carry the
report's figures: tests/transferset/app/test_init.py.)"""
import json

import pytest

from shipped import shipped_models
from students.student import OnnxStudent, Student
from transferset import schema
from transferset.app.cli import main
from transferset.card import CARD_FILE, read_front_matter, write_card

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def student(tmp_path_factory, sst2_dir, sst2_dev200):
    return shipped_models(tmp_path_factory, sst2_dir, sst2_dev200, ("tang",))["tang"]


def _metrics(meta: dict) -> dict:
    return {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}


def test_a_trained_student_has_a_card_from_its_records(student):
    metrics = json.load(open(f"{student}/{schema.METRICS_FILE}"))
    meta = read_front_matter(f"{student}/{CARD_FILE}")
    assert meta["pipeline_tag"] == "text-classification" and meta["labels"] == ["0", "1"]
    assert meta["base_model"] == metrics["transfer"]["teacher_id"]
    assert _metrics(meta) == {"accuracy on the selection split": metrics["dev_accuracy"],
                              "CPU ms per example (batch 1)": metrics["latency_ms_per_example"]["batch_1"],
                              "CPU ms per example (batch 64)": metrics["latency_ms_per_example"]["batch_64"]}
    text = open(f"{student}/{CARD_FILE}", encoding="utf-8").read()
    assert f"{metrics['transfer']['rows']} rows ({metrics['transfer']['labeled_rows']} with a gold label)" in text
    assert f"Student.from_pretrained({student!r})" in text and "test split: not measured" in text
    # the card's three lines load and run the model they name
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(code.replace("print(", "result = ("), scope)
    assert scope["result"][0] in ("0", "1")


def test_export_keeps_the_card_with_what_it_changed(student, tmp_path):
    out = tmp_path / "onnx"
    assert main(["export", "--model", student, "--output", str(out), "--format", "onnx"]) == 0
    source = read_front_matter(f"{student}/{CARD_FILE}")
    meta = read_front_matter(str(out / CARD_FILE))
    assert "onnx" in meta["tags"] and meta["labels"] == source["labels"] and meta["base_model"] == source["base_model"]
    # float32 computes what the student computes: its accuracy stands; latency is the export's own to measure
    assert _metrics(meta) == {"accuracy on the selection split": _metrics(source)["accuracy on the selection split"]}
    text = (out / CARD_FILE).read_text(encoding="utf-8")
    assert f"An ONNX export (float32) of `{student}`, a student" in text and "opset" in text
    assert f"Student.from_pretrained({str(out)!r})" in text
    assert isinstance(Student.from_pretrained(str(out)), OnnxStudent)
    # a rewritten card takes measured figures over the records', as `run` does with results.json's
    write_card(str(out), {"selection": 0.5, "test": 0.25})
    assert _metrics(read_front_matter(str(out / CARD_FILE))) == {"accuracy on the selection split": 0.5,
                                                               "accuracy on the test split": 0.25}


def test_a_folder_without_a_model_gets_no_card(tmp_path):
    assert write_card(str(tmp_path)) is None and not (tmp_path / CARD_FILE).exists()
