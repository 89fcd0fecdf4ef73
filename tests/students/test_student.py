"""Saving and loading students (save_pretrained / from_pretrained) and predicting label names; a saved
transformer student is a plain Hugging Face model, and `transferset evaluate` takes any Hugging Face
sequence classifier (e.g. the teacher)."""
import json

import numpy as np
import pytest
import torch

from students import trainer
from students.build import setup
from students.losses import LossWeights
from students.phases import phases
from students.student import Predictions, Student
from transferset import testing
from transferset.app.cli import main
from transferset.config import StudentConfig
from transferset.contract import schema
from tolerances import assert_reordered  # tests/tolerances.py: a bound from the arithmetic


def _trained_once(values: dict, scored_dir: str):
    """A set-up student after one training step (not its initial weights)."""
    s = setup(StudentConfig(threads=1, **values), scored_dir)
    batch = next(trainer.train_batches(s, scored_dir, seed=0))
    (phase,) = phases("joint", LossWeights.of(s.cfg), 1, s.family.param_groups(s.model).keys())
    trainer.fit(s, phase, [batch])
    return s


@pytest.mark.parametrize("values", [
    {"student": "bilstm", "vocab": {"tokens": "wordpiece"}, "model": {"embed_dim": 32, "hidden": 16}},
    {"student": "bilstm", "vocab": {"tokens": "words"}, "model": {"shape": "tang"}},
    {"student": "transformer", "model": {"n_layer": 2}},
])
def test_save_load_gives_identical_predictions(tmp_path, tiny_scored_dir, sst2_dev_texts, values):
    s = _trained_once(values, tiny_scored_dir)
    student = Student.from_setup(s)
    student.save_pretrained(str(tmp_path / schema.STUDENT_MODEL_DIR))
    before = student.logits(sst2_dev_texts)
    loaded = Student.from_pretrained(str(tmp_path))
    after = loaded.logits(sst2_dev_texts)
    assert np.array_equal(before, after)
    assert len(set(np.round(before[:, 0], 5))) > 10  # not a constant function
    assert loaded.label_names == ["0", "1"] and loaded.family.name == values["student"]
    assert loaded.config == s.model_config and loaded.teacher_id == s.meta[schema.META_TEACHER_ID]
    sidecar = json.loads((tmp_path / schema.STUDENT_MODEL_DIR / schema.STUDENT_SIDECAR_FILE).read_text())
    assert sidecar["family"] == values["student"] and sidecar["label_names"] == ["0", "1"]
    # A loaded student saves again as it was loaded: the pair round-trips.
    loaded.save_pretrained(str(tmp_path / "again"))
    assert np.array_equal(Student.from_pretrained(str(tmp_path / "again")).logits(sst2_dev_texts), before)
    assert json.loads((tmp_path / "again" / schema.STUDENT_SIDECAR_FILE).read_text()) == sidecar


@pytest.mark.parametrize("values", [
    {"student": "bilstm", "model": {"embed_dim": 32, "hidden": 16}},
    {"student": "transformer", "model": {"n_layer": 2}},
])
def test_predict_gives_label_names_and_probabilities(tiny_scored_dir, sst2_dev_texts, values):
    s = _trained_once(values, tiny_scored_dir)
    student = Student.from_setup(s)
    student.label_names = ["negative", "positive"]  # names other than the class indices, so a mix-up shows
    texts = sst2_dev_texts[:40]
    out = student.predict(texts, batch_size=7)
    ids = student.predict_ids(texts)
    assert isinstance(out, Predictions) and out.label_names == ["negative", "positive"]
    assert out.probabilities.shape == (40, 2) and out.probabilities.dtype == np.float32
    np.testing.assert_allclose(out.probabilities.sum(1), 1.0, atol=1e-6)
    assert (out.probabilities > 0).all()
    assert np.array_equal(out.probabilities.argmax(1), ids)
    assert out.labels == [["negative", "positive"][i] for i in ids]
    # The probabilities are the softmax of the logits (not, e.g., of one row against all others).
    logits = student.logits(texts)
    expected = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    np.testing.assert_allclose(out.probabilities, expected, atol=1e-6)
    assert len(set(np.round(out.probabilities[:, 0], 4))) > 5  # not a constant function


def test_predict_refuses_one_string_and_unmatched_pairs(tiny_scored_dir):
    student = Student.from_setup(_trained_once({"model": {"embed_dim": 8, "hidden": 8}}, tiny_scored_dir))
    with pytest.raises(TypeError, match=r"pass a list of texts"):
        student.predict("a single text")
    with pytest.raises(ValueError, match=r"texts_b has 1 rows for 2 texts"):
        student.predict(["a", "b"], ["c"])
    empty = student.predict([])
    assert empty.labels == [] and empty.probabilities.shape == (0, 2)


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory, tiny_scored_dir):
    out = tmp_path_factory.mktemp("transformer_student") / schema.STUDENT_MODEL_DIR
    Student.from_setup(_trained_once({"student": "transformer", "model": {"n_layer": 2}}, tiny_scored_dir)) \
        .save_pretrained(str(out))
    return out


def test_saved_transformer_loads_with_from_pretrained_alone(transformer_dir, sst2_dev_texts):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    ours = Student.from_pretrained(str(transformer_dir.parent)).logits(sst2_dev_texts)
    model = AutoModelForSequenceClassification.from_pretrained(transformer_dir).eval()
    tok = AutoTokenizer.from_pretrained(transformer_dir)
    assert model.config.num_hidden_layers == 2 and model.config.id2label == {0: "0", 1: "1"}
    with torch.no_grad():
        theirs = model(**tok(sst2_dev_texts, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
    assert_reordered(theirs, ours, hidden=128, layers=2)  # transformers' modules, other batches: reordered sums
    assert np.array_equal(theirs.argmax(1), ours.argmax(1))


def test_saved_transformer_runs_in_a_text_classification_pipeline(transformer_dir, sst2_dev_texts):
    from transformers import pipeline

    ours = Student.from_pretrained(str(transformer_dir)).predict(sst2_dev_texts)
    clf = pipeline("text-classification", model=str(transformer_dir), device="cpu")
    # truncation=True: the pipeline then cuts at the saved tokenizer's model_max_length, the student's
    # training max_length (the tiny WordPiece vocabulary spells most words letter by letter).
    theirs = clf(sst2_dev_texts, batch_size=16, truncation=True)
    assert [r["label"] for r in theirs] == ours.labels
    assert set(ours.labels) == {"0", "1"}  # both labels occur: the comparison can fail
    # probabilities move less than the logits they come from: the logits' bound (reordered sums)
    assert_reordered([r["score"] for r in theirs], ours.probabilities.max(1), hidden=128, layers=2)


def test_a_hugging_face_classifier_loads_as_a_student(tiny_teacher4, sst2_dev_texts):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    student = Student.from_pretrained(tiny_teacher4, max_length=32)
    assert student.family.name == "transformer" and student.label_names == ["0", "1"] and student.config is None
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4).eval()
    tok = AutoTokenizer.from_pretrained(tiny_teacher4)
    with torch.no_grad():
        theirs = model(**tok(sst2_dev_texts, padding=True, truncation=True, max_length=32,
                             return_tensors="pt")).logits.numpy()
    assert_reordered(student.logits(sst2_dev_texts), theirs, layers=4)  # other batches: reordered sums


def test_a_model_left_in_training_mode_predicts_in_eval_mode_and_one_in_eval_mode_is_not_walked(
        tiny_teacher4, sst2_dev_texts, monkeypatch):
    """Dropout is off for every prediction; eval() (a walk over every submodule) runs only when needed."""
    student = Student.from_pretrained(tiny_teacher4, max_length=32)
    ref = student.logits(sst2_dev_texts[:20])
    student.model.train()  # e.g. the trainer's model, shared by Student.from_setup
    np.testing.assert_allclose(student.logits(sst2_dev_texts[:20]), ref, atol=1e-6, rtol=0)
    assert not any(m.training for m in student.model.modules())
    calls = []
    monkeypatch.setattr(student.model, "eval", lambda: calls.append(1) or student.model)
    np.testing.assert_allclose(student.logits(sst2_dev_texts[:20]), ref, atol=1e-6, rtol=0)
    assert calls == []


def test_evaluate_takes_a_hugging_face_classifier_without_transferset_files(tiny_teacher4, sst2_dev200, capsys):
    """The teacher's own directory: config.json with id2label and a tokenizer, no sidecar."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    texts, labels = [], []
    with open(sst2_dev200, encoding="utf-8") as fh:
        for line in fh.read().splitlines()[1:]:
            text, label = line.split("\t")
            texts.append(text)
            labels.append(int(label))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4).eval()
    tok = AutoTokenizer.from_pretrained(tiny_teacher4)
    with torch.no_grad():
        pred = np.concatenate([model(**tok(texts[i:i + 128], padding=True, truncation=True, max_length=512,
                                            return_tensors="pt")).logits.argmax(1).numpy()
                               for i in range(0, len(texts), 128)])
    assert res["rows"] == 200 and res["accuracy"] == pytest.approx(float((pred == np.array(labels)).mean()))


def test_evaluate_by_length_gives_each_bands_accuracy(tiny_teacher4, sst2_dev200, capsys):
    """Every row in one band; each band's accuracy is the model's on exactly its rows (SST-2 dev rows span 2-50 words)."""
    assert main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, "--json", "--by-length", "8,16,24"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["accuracy"] == whole["accuracy"] and "by_length" not in whole
    with open(sst2_dev200, encoding="utf-8") as fh:
        rows = [line.split("\t") for line in fh.read().splitlines()[1:]]
    words = np.array([len(text.split()) for text, _ in rows])
    labels = np.array([int(label) for _, label in rows])
    pred = Student.from_pretrained(tiny_teacher4).predict_ids([text for text, _ in rows])
    bands = res["by_length"]
    assert [b["words"] for b in bands] == ["0-7", "8-15", "16-23", "24+"]
    for band, (lo, hi) in zip(bands, [(0, 8), (8, 16), (16, 24), (24, 10**6)]):
        keep = (words >= lo) & (words < hi)
        assert keep.sum() > 10 and band["rows"] == band["labeled_rows"] == keep.sum()
        assert band["accuracy"] == pytest.approx(float((pred[keep] == labels[keep]).mean()))
    assert sum(b["rows"] for b in bands) == res["rows"] == 200
    # the default bands, as text
    assert main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, "--by-length"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[-4:]] == ["0-9", "10-19", "20-29", "30+"]


def test_evaluate_by_length_on_a_scored_set_gives_agreement_per_band(tiny_teacher4, tiny_scored_dir, capsys):
    # The set's own teacher agrees with its labels in every band; a band no row falls in says so (None).
    assert main(["evaluate", "--model", tiny_teacher4, "--data", tiny_scored_dir, "--json", "--max-length", "64",
                 "--by-length", "1,1000"]) == 0
    res = json.loads(capsys.readouterr().out)
    filled = [b for b in res["by_length"] if b["rows"]]
    assert sum(b["rows"] for b in filled) == res["rows"] == 128
    assert filled and all(b["teacher_agreement"] == 1.0 for b in filled)
    assert res["by_length"][-1] == {"words": "1000+", "rows": 0, "labeled_rows": 0, "accuracy": None,
                                    "teacher_agreement": None}


@pytest.mark.parametrize("edges", ["0,10", "10,10", "20,10", "x", ""])
def test_evaluate_by_length_refuses_bad_edges(tiny_teacher4, sst2_dev200, edges, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, f"--by-length={edges}"])
    assert exc.value.code == 2
    assert f"--by-length {edges!r}: length band edges must be positive whole numbers of words in increasing order, " \
        "e.g. 10,20,30" in capsys.readouterr().err


@pytest.mark.parametrize("edges", ["5,,10", "5,10,", ",5"])
def test_evaluate_by_length_refuses_an_empty_edge(tiny_teacher4, sst2_dev200, edges, capsys):
    """`--by-length 5,,10` (or a comma at an end) is refused, exit 2, never silently read as 5,10."""
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--model", tiny_teacher4, "--data", sst2_dev200, "--by-length", edges])
    assert exc.value.code == 2
    assert f"--by-length {edges!r}: an empty edge (two commas in a row, or one at an end); give whole numbers of " \
        "words in increasing order, e.g. 10,20,30" in capsys.readouterr().err


def test_words_per_row_counts_both_texts_of_a_pair():
    from students.evaluate import length_bands, words_per_row

    words = words_per_row(["a b c", "", "one"], ["d e", None, ""])
    assert words.tolist() == [5, 0, 1]
    bands = length_bands(words, (1, 5))
    assert [(name, mask.tolist()) for name, mask in bands] == [
        ("0-0", [False, True, False]), ("1-4", [False, False, True]), ("5+", [True, False, False])]


def test_evaluate_on_the_teachers_scored_set_agrees_with_its_labels(tiny_teacher4, tiny_scored_dir, capsys):
    # The teacher scored this set (64 tokens per row), so against its own teacher_label it agrees on every row.
    assert main(["evaluate", "--model", tiny_teacher4, "--data", tiny_scored_dir, "--json", "--max-length", "64"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rows"] == 128 and res["teacher_agreement"] == 1.0


def test_from_pretrained_refuses_a_directory_that_is_neither(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["evaluate", "--model", str(tmp_path), "--data", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"neither model/{schema.STUDENT_SIDECAR_FILE} nor config.json" in err and "transferset teacher" in err
    (tmp_path / schema.STUDENT_SIDECAR_FILE).write_text(json.dumps({"family": "cnn"}))
    assert main(["evaluate", "--model", str(tmp_path), "--data", str(tmp_path)]) == 1
    assert "unknown student family 'cnn'; known: bilstm, static, transformer" in capsys.readouterr().err


class _OnDevice:
    """Stands in for a tensor on an accelerator: numpy() fails as torch's does until .cpu() brings it back."""

    def __init__(self, tensor, on_cpu=False):
        self.tensor, self.on_cpu = tensor, on_cpu

    def float(self):
        return _OnDevice(self.tensor.float(), self.on_cpu)

    def detach(self):
        return _OnDevice(self.tensor.detach(), self.on_cpu)

    def cpu(self):
        return _OnDevice(self.tensor, True)

    def numpy(self):
        if not self.on_cpu:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        return self.tensor.numpy()


def _small_bilstm(scored_dir):
    from students.build import setup as build_setup

    return Student.from_setup(build_setup(StudentConfig(**testing.small_student(vocab={"embed_init": "random"})), scored_dir))


def test_logits_are_brought_back_to_the_cpu(tiny_scored_dir, sst2_dev_texts):
    import dataclasses

    student = _small_bilstm(tiny_scored_dir)
    expected = student.logits(sst2_dev_texts[:20])
    forward = student.family.forward
    student.family = dataclasses.replace(
        student.family, forward=lambda model, batch: {k: _OnDevice(v) for k, v in forward(model, batch).items()})
    assert np.array_equal(student.logits(sst2_dev_texts[:20]), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_student_on_the_gpu_predicts_as_on_the_cpu(tiny_scored_dir, sst2_dev_texts):
    student = _small_bilstm(tiny_scored_dir)
    expected = student.logits(sst2_dev_texts)
    student.model.to("cuda")
    np.testing.assert_allclose(student.logits(sst2_dev_texts), expected, atol=1e-4)
    assert student.predict(sst2_dev_texts).labels == [student.label_names[i] for i in expected.argmax(-1)]
