"""Model cards (transferset/data/card.py): a student saved by `transferset train` has one written from its records,
and `transferset export` keeps it in the export folder with what the export changed. (A run's cards carry the
report's figures: tests/transferset/app/run/test_init.py.)"""
import json
import re

import pytest

from shipped import shipped_models
from students.student import OnnxStudent, Student
from transferset.app.cli import main
from transferset.contract import schema
from transferset.data.card import CARD_FILE, read_front_matter, shown_path, write_card

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
    # the tiny teacher is known by its local folder only: no base_model, and its folder relative to the student's
    assert "base_model" not in meta
    text = open(f"{student}/{CARD_FILE}", encoding="utf-8").read()
    teacher = metrics["transfer"]["teacher_id"]
    shown = shown_path(teacher, student)
    assert f"from the teacher `{shown}`." in text and not shown.startswith("/")
    assert _metrics(meta) == {"accuracy on the selection split": metrics["dev_accuracy"],
                              "CPU ms per example (batch 1)": metrics["latency_ms_per_example"]["batch_1"],
                              "CPU ms per example (batch 64)": metrics["latency_ms_per_example"]["batch_64"]}
    assert f"{metrics['transfer']['rows']} rows ({metrics['transfer']['labeled_rows']} with a gold label)" in text
    assert f"Student.from_pretrained({student!r})" in text and "test split: not measured" in text
    cfg = metrics["config"]  # the training line: the family, its phase plan, ..., its model's settings (its shape)
    assert f"- training: student {cfg['student']}, phases {cfg['phases']}, epochs " in text
    assert f", model {cfg['model']}" in text and cfg["model"]["shape"] == "tang"
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
    assert "onnx" in meta["tags"] and meta["labels"] == source["labels"]
    assert meta.get("base_model") == source.get("base_model")
    # float32 computes what the student computes: its accuracy stands; latency is the export's own to measure
    assert _metrics(meta) == {"accuracy on the selection split": _metrics(source)["accuracy on the selection split"]}
    text = (out / CARD_FILE).read_text(encoding="utf-8")
    assert f"An ONNX export (float32) of `{shown_path(student, str(out))}`, a student" in text and "opset" in text
    assert f"Student.from_pretrained({str(out)!r})" in text
    assert isinstance(Student.from_pretrained(str(out)), OnnxStudent)
    # a rewritten card takes measured figures over the records', as `run` does with results.json's
    write_card(str(out), {"selection": 0.5, "test": 0.25})
    assert _metrics(read_front_matter(str(out / CARD_FILE))) == {"accuracy on the selection split": 0.5,
                                                               "accuracy on the test split": 0.25}


def test_a_folder_without_a_model_gets_no_card(tmp_path):
    assert write_card(str(tmp_path)) is None and not (tmp_path / CARD_FILE).exists()


HOSTILE = ["<script>alert(1)</script>", "[click](javascript:alert(1))", "two\nlines *and* _more_"]


def _fake_run(tmp_path, labels, base_model):
    """A run folder's teacher/ and students/s/ records (no weights: a card reads only the records)."""
    run = tmp_path / "home" / "me" / "runs" / "demo"
    teacher, student = run / "teacher", run / "students" / "s"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(labels)}}))
    (teacher / schema.METRICS_FILE).write_text(json.dumps({
        "base_model": base_model, "label_names": labels, "train": str(run / "data" / "labeled.jsonl"),
        "train_rows": 10, "best_dev_accuracy": 0.5}))
    (student / schema.STUDENT_MODEL_DIR).mkdir(parents=True)
    (student / schema.STUDENT_MODEL_DIR / schema.STUDENT_SIDECAR_FILE).write_text(json.dumps({"label_names": labels}))
    (student / schema.METRICS_FILE).write_text(json.dumps({
        "student": "bilstm", "dev_accuracy": 0.5, "dev": str(run / "data" / "validation.jsonl"),
        "transfer": {"dir": str(run / "transfer"), "teacher_id": str(teacher), "rows": 30, "labeled_rows": 10}}))
    return run, teacher, student


def test_label_names_are_escaped_in_the_body_and_kept_whole_in_the_front_matter(tmp_path):
    run, teacher, student = _fake_run(tmp_path, HOSTILE, "prajjwal1/bert-tiny")
    for folder in (teacher, student):
        write_card(str(folder))
        text = (folder / CARD_FILE).read_text(encoding="utf-8")
        assert read_front_matter(str(folder / CARD_FILE))["labels"] == HOSTILE
        body = text.split("\n---\n", 1)[1]
        # no tag, no link (its `[` escaped), the sentence on one line
        assert "<script>" not in body and re.search(r"(?<!\\)\[click", body) is None and "two\nlines" not in body
        assert ("Labels, in class order: &lt;script&gt;alert(1)&lt;/script&gt;, \\[click\\](javascript:alert(1)), "
                "two lines \\*and\\* \\_more\\_.") in body


def test_base_model_is_the_teachers_hub_id_and_no_card_names_the_authors_folders(tmp_path):
    run, teacher, student = _fake_run(tmp_path, ["neg", "pos"], "prajjwal1/bert-tiny")
    for folder in (teacher, student):
        write_card(str(folder))
        assert read_front_matter(str(folder / CARD_FILE))["base_model"] == "prajjwal1/bert-tiny"
    text = (student / CARD_FILE).read_text(encoding="utf-8")
    assert "from the teacher `teacher` (fine-tuned from `prajjwal1/bert-tiny`)." in text
    assert "- transfer set: `transfer`, 30 rows" in text and "(`data/validation.jsonl`)" in text
    assert "on `data/labeled.jsonl` (10 rows)" in (teacher / CARD_FILE).read_text(encoding="utf-8")
    # a teacher fine-tuned from a local folder: only that path is known, so no base_model at all
    local = tmp_path / "my-encoder"
    local.mkdir()
    run, teacher, student = _fake_run(tmp_path / "b", ["neg", "pos"], str(local))
    for folder in (teacher, student):
        write_card(str(folder))
        assert "base_model" not in read_front_matter(str(folder / CARD_FILE))
        body = (folder / CARD_FILE).read_text(encoding="utf-8").split("## Use it")[0]
        assert str(tmp_path) not in body


def test_the_training_line_says_each_loss_with_its_weight_and_its_settings(tmp_path):
    run, teacher, student = _fake_run(tmp_path, ["neg", "pos"], "prajjwal1/bert-tiny")
    metrics = json.loads((student / schema.METRICS_FILE).read_text())
    metrics["config"] = {"student": "bilstm", "epochs": 3,
                         "losses": {"kd": {"weight": 1.0, "temperature": 2.0}, "ce": 0.5, "mse": {"weight": 0.0}}}
    (student / schema.METRICS_FILE).write_text(json.dumps(metrics))
    write_card(str(student))
    text = (student / CARD_FILE).read_text(encoding="utf-8")
    # a loss at weight 0 trains nothing: not on the card
    assert "- training: student bilstm, epochs 3, losses kd 1.0 at temperature 2.0 + ce 0.5\n" in text


def test_every_card_we_write_parses_as_a_hugging_face_model_card_with_the_fields_we_put_in(tmp_path):
    from huggingface_hub import ModelCard

    run, teacher, student = _fake_run(tmp_path, HOSTILE, "prajjwal1/bert-tiny")
    metrics = json.loads((student / schema.METRICS_FILE).read_text())
    metrics["latency_ms_per_example"] = {"batch_1": 1.5, "batch_64": 0.25}
    (student / schema.METRICS_FILE).write_text(json.dumps(metrics))
    export = run / "onnx"  # an export's records: model.onnx and its config.json (no weights read)
    export.mkdir()
    (export / "model.onnx").write_bytes(b"")
    (export / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(HOSTILE)},
                                                    "transferset_export": {"source": str(student), "opset": 17}}))
    want = {teacher: ("transformers", [], {"accuracy on the selection split": 0.5, "accuracy on the test split": 0.25}),
            student: ("transferset", ["knowledge-distillation"],
                      {"accuracy on the selection split": 0.5, "accuracy on the test split": 0.25,
                       "CPU ms per example (batch 1)": 1.5, "CPU ms per example (batch 64)": 0.25}),
            export: ("transferset", ["knowledge-distillation", "onnx"], {"accuracy on the selection split": 0.5})}
    for folder, (library, tags, figures) in want.items():
        write_card(str(folder), {"test": 0.25} if folder != export else None)
        data = ModelCard((folder / CARD_FILE).read_text(encoding="utf-8")).data  # raises where the hub could not
        assert (data.pipeline_tag, data.library_name, data.base_model) == ("text-classification", library,
                                                                           "prajjwal1/bert-tiny")
        assert data.tags == ["text-classification", "transferset", *tags] and data.labels == HOSTILE
        assert data.model_name == folder.name
        assert {r.metric_name: r.metric_value for r in data.eval_results} == figures
        assert {(r.task_type, r.dataset_type, r.dataset_name) for r in data.eval_results} == {
            ("text-classification", "custom", "own labeled data")}
        assert data.to_dict() == read_front_matter(str(folder / CARD_FILE))  # what the hub reads is what we wrote
