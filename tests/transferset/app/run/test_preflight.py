"""`transferset run` refuses, before its first stage, what the stages would only find out later: one line,
exit 2, no run folder."""
import json
import shutil

import pytest

from transferset import testing
from transferset.app.cli import main

GOOD = ["a fine film", "a dull film", "great acting", "awful plot", "charming story", "boring story",
        "very funny", "really bad", "good movie", "bad movie"]


def _tsv(path, rows, header="sentence\tlabel"):
    path.write_text(header + "\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    return str(path)


def _two_classes(tmp_path, name="train.tsv"):
    return _tsv(tmp_path / name, [(t, i % 2) for i, t in enumerate(GOOD)])


def _refused(capsys, argv, says, run_dir):
    rc = main(["run", *argv, f"run_dir={run_dir}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert says in err, err
    assert not run_dir.exists()  # no folder, no lock, no stage
    return err


def test_a_text_column_that_is_the_label_column_is_refused(tmp_path, capsys):
    train = _two_classes(tmp_path)
    _refused(capsys, ["--data", train, "--text-column", "label", "--label-column", "label"],
             "teacher.text_column and teacher.label_column are both 'label'", tmp_path / "run")


@pytest.mark.parametrize("label", ["pos", 1])
def test_a_train_file_of_one_class_is_refused(tmp_path, capsys, label):
    """With integer labels it trained a two-class model on one class and reported 100 %."""
    train = _tsv(tmp_path / "train.tsv", [(t, label) for t in GOOD])
    _refused(capsys, ["--data", train], f"every labeled row is of one class ('{label}', 10 rows) in column 'label'",
             tmp_path / "run")


def test_a_test_label_the_train_file_never_has_is_refused(tmp_path, capsys):
    train = _tsv(tmp_path / "train.tsv", [(t, "neg" if i % 2 else "pos") for i, t in enumerate(GOOD)])
    test = _tsv(tmp_path / "test.tsv", [("fine", "pos"), ("meh", "neutral")])
    err = _refused(capsys, ["--data", train, "--test", test], f"test: {test} has label(s) ['neutral'] that the "
                   f"train file {train} never has", tmp_path / "run")
    assert "--labels" not in err  # a flag `run` does not have
    # an integer label past the train file's classes likewise; one inside 0..max is a class of the teacher
    train = _two_classes(tmp_path, "ints.tsv")
    _refused(capsys, ["--data", train, "--test", _tsv(tmp_path / "t2.tsv", [("x", 0), ("y", 2)])], "['2']",
             tmp_path / "run")


def test_a_given_teacher_with_pickle_weights_or_its_own_code_is_refused(tmp_path, capsys):
    train = _two_classes(tmp_path)
    pickled = tmp_path / "pickled"
    shutil.copytree(testing.tiny_classifier(str(tmp_path / "tiny")), pickled)
    for f in pickled.glob("*.safetensors"):
        f.rename(pickled / "pytorch_model.bin")
    _refused(capsys, ["--data", train, f"teacher_path={pickled}"], f"teacher_path={pickled}: ", tmp_path / "run")
    coded = tmp_path / "coded"
    shutil.copytree(tmp_path / "tiny", coded)
    cfg = json.loads((coded / "config.json").read_text())
    (coded / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "mine.Evil"}}))
    err = _refused(capsys, ["--data", train, f"teacher_path={coded}"], "ships its own Python code", tmp_path / "run")
    assert "score.trust_remote_code" in err


def test_a_grad_accum_past_the_teachers_epoch_is_refused(tmp_path, capsys):
    train = _two_classes(tmp_path)
    _refused(capsys, ["--data", train, "teacher.batch_size=4", "teacher.engine.grad_accum=8"],
             "teacher.engine.grad_accum 8 exceeds the 3 batches of an epoch", tmp_path / "run")


def test_a_bad_override_is_blamed_on_the_override_not_the_config(tmp_path, capsys):
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={tmp_path / 'run'}", "students.distilled.epochs=nan"])
    err = capsys.readouterr().err
    assert rc == 2 and "students.distilled.epochs=nan: not a number (expected int)" in err, err
    assert "demo.yaml" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, value, says", [
    ("--budget-ms", "1e-9", "--budget-ms 1e-09: below what the timing can tell apart (0.02 ms per example); give "
                            "at least 0.02"),
    ("--budget-ms", "0", "--budget-ms 0.0: input should be greater than 0 (expected float or null)"),
    ("--budget-mb", "-1", "--budget-mb -1.0: input should be greater than 0 (expected float or null)"),
    ("--budget-minutes", "0", "--budget-minutes 0.0: input should be greater than 0 (expected float or null)")])
def test_a_bad_budget_flag_is_blamed_on_the_flag_as_typed_not_the_config(tmp_path, capsys, flag, value, says):
    err = _refused(capsys, ["--config", "configs/demo.yaml", flag, value], says, tmp_path / "run")
    assert err == f"transferset run: error: {says}\n"


@pytest.mark.parametrize("n_layer", [0, -1])
def test_a_student_of_fewer_than_one_layer_is_refused_when_the_settings_load(tmp_path, capsys, n_layer):
    # teacher_path names no folder: were the setting not refused on load, that would be (and nothing would train)
    config = tmp_path / "t.yaml"
    config.write_text(f"teacher_path: {tmp_path / 'none'}\n"
                      f"students: {{t: {{student: transformer, model: {{n_layer: {n_layer}}}}}}}\n")
    err = _refused(capsys, ["--config", str(config)], "n_layer", tmp_path / "run")
    assert err == (f"transferset run: error: {config}: students.t.model.n_layer = {n_layer}: input should be "
                   "greater than or equal to 1\n")
    # set by key=value, the override as typed is blamed; a search candidate's is refused before the first stage
    err = _refused(capsys, ["--config", str(config), "students.t.model.n_layer=-2"], "n_layer", tmp_path / "run")
    assert err == "transferset run: error: students.t.model.n_layer=-2: input should be greater than or equal to 1\n"
    err = _refused(capsys, ["--config", "configs/demo.yaml", f"teacher_path={tmp_path / 'none'}", "--budget-mb", "5",
                            f"search.space={{t: {{student: transformer, model: {{n_layer: {n_layer}}}}}}}"],
                   "n_layer", tmp_path / "run")
    assert err == (f"transferset run: error: search.space.t: model.n_layer = {n_layer}: input should be greater "
                   "than or equal to 1\n")
