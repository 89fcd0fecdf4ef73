"""Model cards (transferset/card.py): a student saved by `transferset train` has one written from its records,
and `transferset export` keeps it in the export folder with what the export changed. (A run's cards carry the
report's figures: tests/transferset/app/test_init.py.)"""
import json
import os

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
    # its teacher is a local folder: no base_model a hub would misread, and no one's file system in the text
    assert "base_model" not in meta
    assert metrics["transfer"]["teacher_id"] not in open(f"{student}/{CARD_FILE}", encoding="utf-8").read()
    assert _metrics(meta) == {"accuracy on the selection split": metrics["dev_accuracy"],
                              "CPU ms per example (batch 1)": metrics["latency_ms_per_example"]["batch_1"],
                              "CPU ms per example (batch 64)": metrics["latency_ms_per_example"]["batch_64"]}
    text = open(f"{student}/{CARD_FILE}", encoding="utf-8").read()
    assert f"{metrics['transfer']['rows']} rows ({metrics['transfer']['labeled_rows']} with a gold label)" in text
    name = os.path.basename(student)
    assert f"Student.from_pretrained({name!r})" in text and "test split: not measured" in text
    # the card's lines load and run the model they name, from the folder that holds it
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    here = os.getcwd()
    os.chdir(os.path.dirname(student))
    try:
        exec(code.replace("print(", "result = ("), scope)
    finally:
        os.chdir(here)
    assert scope["result"][0] in ("0", "1")


def test_export_keeps_the_card_with_what_it_changed(student, tmp_path):
    out = tmp_path / "onnx"
    assert main(["export", "--model", student, "--output", str(out), "--format", "onnx"]) == 0
    source = read_front_matter(f"{student}/{CARD_FILE}")
    meta = read_front_matter(str(out / CARD_FILE))
    assert "onnx" in meta["tags"] and meta["labels"] == source["labels"] and "base_model" not in meta
    # float32 computes what the student computes: its accuracy stands; latency is the export's own to measure
    assert _metrics(meta) == {"accuracy on the selection split": _metrics(source)["accuracy on the selection split"]}
    text = (out / CARD_FILE).read_text(encoding="utf-8")
    assert "An ONNX export (float32) of `" in text and ", a student." in text and "opset" in text
    assert f"Student.from_pretrained('onnx')" in text
    assert isinstance(Student.from_pretrained(str(out)), OnnxStudent)
    # a rewritten card takes measured figures over the records', as `run` does with results.json's
    write_card(str(out), {"selection": 0.5, "test": 0.25})
    assert _metrics(read_front_matter(str(out / CARD_FILE))) == {"accuracy on the selection split": 0.5,
                                                               "accuracy on the test split": 0.25}


def test_a_folder_without_a_model_gets_no_card(tmp_path):
    assert write_card(str(tmp_path)) is None and not (tmp_path / CARD_FILE).exists()


NASTY = ["<script>alert(1)</script>", "[click](javascript:alert(1))", "two\nlines", "`code` *bold*"]


def test_label_names_and_paths_cannot_make_markup_and_a_hub_backbone_is_the_base_model(tmp_path):
    """Label names come from a user's file: in the card's body they stay plain text on one line (no tag, no link,
    no split sentence), and the front matter keeps them exact. The teacher's base model is its hub id; the card
    names no absolute local path."""
    teacher = tmp_path / "runs" / "demo" / "teacher"
    teacher.mkdir(parents=True)
    (teacher / schema.HF_CONFIG_FILE).write_text(json.dumps(
        {"id2label": {str(i): name for i, name in enumerate(NASTY)},
         "_name_or_path": "/home/me/.cache/all-MiniLM-L6-v2"}))
    (teacher / schema.METRICS_FILE).write_text(json.dumps(
        {"base_model": "sentence-transformers/all-MiniLM-L6-v2", "train": str(tmp_path / "runs/demo/data/l.jsonl"),
         "train_rows": 10, "best_dev_accuracy": 0.5}))
    write_card(str(teacher))
    meta = read_front_matter(str(teacher / CARD_FILE))
    assert meta["labels"] == NASTY and meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    text = (teacher / CARD_FILE).read_text(encoding="utf-8")
    body = text.split("\n---\n", 1)[1]
    assert "<script>" not in body and "](javascript:" not in body and "&lt;script&gt;" in body
    labels_line = next(line for line in body.splitlines() if line.startswith("Labels, in class order:"))
    assert "two lines" in labels_line and "\\`code\\` \\*bold\\*" in labels_line
    assert str(tmp_path) not in body and "/home/me" not in text
    # a teacher fine-tuned from a local folder has no base_model at all
    (teacher / schema.METRICS_FILE).write_text(json.dumps({"base_model": str(tmp_path / "mpnet")}))
    write_card(str(teacher))
    assert "base_model" not in read_front_matter(str(teacher / CARD_FILE))
    assert "fine-tuned from a local model" in (teacher / CARD_FILE).read_text(encoding="utf-8")
