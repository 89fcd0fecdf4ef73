"""`transferset prune` (students/compress/prune.py): rank, remove, recover from the cached logits, save in the input's form.

A tiny real BERT teacher (transferset.testing) scores the rows with the project's scorer; the scored set's
teacher_logits are its logits negated and the selection labels its labels flipped, so the pruned model
can only reach the selection's labels by learning the cached logits: recovery is seen to distil from them.
"""
import json
import os

import numpy as np
import pytest
import torch

from students.build import FAMILIES
from students.data.tokens import WordPieceTokens
from students.families.transformer import TransformerConfig
from students.student import OnnxStudent, Student
from transferset import testing
from transferset.app import cli
from transferset.contract import schema
from transferset.models import loading, pruning
from transferset.teacher.scoring import Teacher
from tolerances import assert_reordered  # reordered sums, at most 4 layers deep

TEXTS = [f"{a} {b} {c}" for a in testing.WORDS[:40] for b in ("good", "bad") for c in ("movie", "plot ever")]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("prune")
    teacher = testing.tiny_classifier(str(root / "teacher"), num_heads=4, num_layers=2)
    scores = Teacher.load(teacher, forward="padded").predict(TEXTS)
    scored = testing.write_scored_set(str(root / "scored"), TEXTS, -scores.logits, scores.hidden)
    selection = root / "selection.tsv"
    selection.write_text("sentence\tlabel\n" + "".join(f"{t}\t{1 - y}\n" for t, y in zip(TEXTS[:40], scores.labels)))
    return {"root": root, "teacher": teacher, "scored": scored, "selection": str(selection), "targets": -scores.logits}


def run_prune(task, output, *flags):
    return cli.main(["prune", "--model", task["teacher"], "--selection", task["selection"], "--output", str(output),
                     "--no-progress", *flags])


def test_prune_removes_the_heads_then_recovers_from_the_cached_teacher_logits(task, tmp_path, capsys):
    out = tmp_path / "pruned"
    assert run_prune(task, out, "--transfer", task["scored"], "--heads", "2", "--epochs", "3", "--lr", "3e-3",
                     "--batch-size", "16") == 0
    record = json.loads((out / schema.PRUNE_FILE).read_text())
    removed = {int(k): v for k, v in record["removed"].items()}
    assert sum(map(len, removed.values())) == 2 and record["heads"] == {"before": 8, "after": 6}
    assert record["parameters"]["after"] < record["parameters"]["before"]
    # The ranking the command used is the library's on the selection rows.
    assert removed == pruning.least_important(np.array(record["importance"]), 2)
    sel = record["selection"]
    # Recovery learned the negated logits, so the flipped labels: far above the pruned model as it started.
    assert sel["accuracy_pruned"] < 0.3 and sel["accuracy_final"] >= sel["accuracy_pruned"] + 0.5
    assert record["recovery"]["phase"]["best_dev_accuracy"] == sel["accuracy_final"]
    # The teacher's form: a plain Hugging Face directory, loaded by score, evaluate and predict's loaders.
    assert not (out / schema.STUDENT_SIDECAR_FILE).exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == pruning.MODEL_TYPE
    student = Student.from_pretrained(str(out))
    assert student.model.config.kept_heads == record["kept_heads"]
    start = pruning.prune_heads(loading.load_classifier(task["teacher"]).eval(), removed)
    with torch.no_grad():
        ids, mask, types = student.tokens.encode(TEXTS)
        before = start(input_ids=ids, attention_mask=mask.long(), token_type_ids=types).logits.numpy()
    after = student.logits(TEXTS)
    mse = lambda x: float(((x - task["targets"]) ** 2).mean())  # noqa: E731
    assert mse(after) < 0.5 * mse(before)
    assert_reordered(Teacher.load(str(out)).predict(TEXTS).logits, after, layers=4)  # packed scorer
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", str(out), "--data", task["selection"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(sel["accuracy_final"])


def test_a_pruned_student_stays_a_student_and_exports_to_onnx(task, tmp_path):
    model = loading.load_classifier(task["teacher"]).eval()
    tokens = WordPieceTokens(loading.load_tokenizer(task["teacher"]), 32)
    src = tmp_path / "student"
    Student(model, tokens, ["0", "1"], FAMILIES["transformer"], TransformerConfig(n_layer=2)).save_pretrained(str(src))
    out = tmp_path / "pruned"
    assert cli.main(["prune", "--model", str(src), "--selection", task["selection"], "--output", str(out),
                     "--heads", "0.5", "--epochs", "0", "--no-progress"]) == 0
    record = json.loads((out / schema.PRUNE_FILE).read_text())
    assert record["recovery"] is None and record["heads"]["after"] == 4
    student = Student.from_pretrained(str(out))
    assert student.family.name == "transformer" and student.config == TransformerConfig(n_layer=2)
    assert student.tokens.max_length == 32
    removed = {int(k): v for k, v in record["removed"].items()}
    expect = Student(pruning.prune_heads(model, removed), tokens, ["0", "1"], FAMILIES["transformer"]).logits(TEXTS)
    np.testing.assert_array_equal(student.logits(TEXTS), expect)
    assert cli.main(["export", "--model", str(out), "--output", str(tmp_path / "onnx")]) == 0
    onnx = Student.from_pretrained(str(tmp_path / "onnx"))
    assert isinstance(onnx, OnnxStudent)
    assert_reordered(onnx.logits(TEXTS), expect, layers=4)
    # An export is refused as an input, with what to do instead.
    assert cli.main(["prune", "--model", str(tmp_path / "onnx"), "--selection", task["selection"],
                     "--output", str(tmp_path / "again"), "--epochs", "0"]) == 1


def test_heads_zero_removes_none_and_distils_the_model_on_its_own_cached_logits(task, tmp_path):
    """--heads 0: no ranking, every head kept, the recovery alone (a born-again model): it learns the cached
    (negated) logits, so the flipped selection labels."""
    out = tmp_path / "born-again"
    assert run_prune(task, out, "--transfer", task["scored"], "--heads", "0", "--epochs", "3", "--lr", "3e-3",
                     "--batch-size", "16") == 0
    record = json.loads((out / schema.PRUNE_FILE).read_text())
    assert record["removed"] == {} and record["importance"] is None
    assert record["heads"] == {"before": 8, "after": 8}
    assert record["parameters"]["after"] == record["parameters"]["before"]
    sel = record["selection"]
    assert sel["accuracy_pruned"] == sel["accuracy_before"] < 0.3 and sel["accuracy_final"] >= sel["accuracy_before"] + 0.5
    after = Student.from_pretrained(str(out)).logits(TEXTS)
    mse = lambda x: float(((x - task["targets"]) ** 2).mean())  # noqa: E731
    assert mse(after) < 0.5 * mse(-task["targets"])  # the model started at the un-negated logits


def test_prune_refuses_what_it_cannot_do_with_a_reason(task, tmp_path, capsys):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    distil = tmp_path / "distil"
    DistilBertForSequenceClassification(DistilBertConfig(vocab_size=200, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
                                        ).save_pretrained(str(distil))
    loading.load_tokenizer(task["teacher"]).save_pretrained(str(distil))
    cases = [
        (["--model", str(distil), "--epochs", "0"], "is not a BERT sequence classifier"),
        (["--model", task["teacher"], "--epochs", "0", "--heads", "7"], "pass a count from 1 to 6"),
        (["--model", task["teacher"], "--epochs", "0", "--heads", "0.01"], "removes 0 of the model's 8 heads"),
        (["--model", task["teacher"]], "pass --transfer DIR"),
        (["--model", task["teacher"], "--epochs", "0", "--heads", "0"], "--heads 0 removes no head"),
    ]
    for k, (flags, message) in enumerate(cases):
        argv = ["prune", "--selection", task["selection"], "--output", str(tmp_path / f"out{k}"), *flags]
        assert cli.main(argv) == 1, flags
        assert message in capsys.readouterr().err
        assert not os.path.exists(tmp_path / f"out{k}" / "model.safetensors")


def test_a_model_with_early_exits_is_refused_in_one_line(task, tmp_path, capsys):
    """A model with early exits is refused in one line, never pruned into an output with stale exits.* that
    nothing can load."""
    import shutil

    from students.families.exits import Branches, BranchesConfig, save_branches

    model = tmp_path / "with_exits"
    shutil.copytree(task["teacher"], model)
    save_branches(str(model), Branches(BranchesConfig(layers=1, hidden=32, classes=2, width=4)), {})
    for given in (model, tmp_path):  # the model folder, or a run folder holding it as model/
        if given == tmp_path:
            shutil.move(str(model), str(tmp_path / schema.STUDENT_MODEL_DIR))
        out = tmp_path / "out"
        argv = ["prune", "--model", str(given), "--selection", task["selection"], "--output", str(out),
                "--epochs", "0", "--heads", "1"]
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert f"--model {given}: has early exits (exits.json)" in err and "prune the backbone first" in err
        assert not out.exists()


def test_heads_says_whether_it_took_a_count_or_a_fraction_and_names_a_bad_value_once(task, tmp_path, capsys):
    """`--heads` says whether it took a count or a fraction (`1.0` is one head, where a user may mean a
    fraction), names a bad value such as 1.5 once, and calls nan and ±inf not a number, not "should be ≥ 0"."""
    for k, (heads, says) in enumerate((("1.0", "--heads 1: removes 1 head (a count; a fraction of the heads is "
                                                "written below 1, e.g. 0.5)"),
                                       ("0.25", "--heads 0.25: removes 2 of the model's 8 heads (a fraction)"))):
        assert run_prune(task, tmp_path / f"out{k}", "--heads", heads, "--epochs", "0") == 0
        assert says in capsys.readouterr().err
    assert run_prune(task, tmp_path / "bad", "--heads", "1.5", "--epochs", "0") == 1
    err = capsys.readouterr().err
    assert "error: --heads 1.5: expected a number of heads (1, 2, ...) or a fraction in (0, 1)" in err
    assert err.count("1.5") == 1
    for value in ("nan", "inf", "-inf"):
        assert run_prune(task, tmp_path / "bad", "--heads", value, "--epochs", "0") == 2
        err = capsys.readouterr().err
        assert f"error: --heads {value}: not a number (expected float)" in err and "should be" not in err, err
    assert not (tmp_path / "bad" / "model.safetensors").exists()
