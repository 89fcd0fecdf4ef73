"""A user's mistake with `train` or `evaluate` gets one clear message (what, where, what to do), never
a traceback: exit 2 for usage errors, 1 for work that cannot be done."""
import json
import os

import pytest

from transferset import schema
from transferset.app.cli import main

SMALL = "threads: 1\nlatency_examples: 8\nembed_init: random\nmodel: {embed_dim: 8, hidden: 8}\n"


def _call(args, capsys):
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.fixture(scope="module")
def small_student(tmp_path_factory, tiny_scored_dir, sst2_dev200):
    d = tmp_path_factory.mktemp("small_student")
    (d / "cfg.yaml").write_text(SMALL)
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(d / "run"),
                 "--config", str(d / "cfg.yaml"), "--epochs", "1", "--no-progress"]) == 0
    return d / "run"


def test_missing_dev_or_data_file(tmp_path, tiny_scored_dir, small_student, capsys):
    missing = str(tmp_path / "nope.tsv")
    rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", missing, "--output", str(tmp_path / "o")],
                    capsys)
    assert rc == 1 and f"{missing}: no such file" in err and "--dev" in err
    rc, err = _call(["evaluate", "--model", str(small_student), "--data", missing], capsys)
    assert rc == 1 and f"{missing}: no such file" in err and "--data" in err
    rc, err = _call(["train", "--transfer", str(tmp_path / "nothing"), "--dev", missing,
                     "--output", str(tmp_path / "o")], capsys)
    assert rc == 1 and "nothing" in err


def test_dev_file_whose_rows_are_all_rejected(tmp_path, tiny_scored_dir, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("review\tlabel\ngood\t1\nbad\t0\n")
    rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", str(dev), "--output", str(tmp_path / "o")],
                    capsys)
    assert rc == 1 and f"{dev}: every row was rejected (2 rows)" in err and "--text-column" in err


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_damaged_weights_for_evaluate(tmp_path, small_student, sst2_dev200, damage, capsys):
    import shutil

    copy = tmp_path / "student"
    shutil.copytree(small_student, copy)
    weights = copy / schema.STUDENT_MODEL_DIR / schema.WEIGHTS_FILE
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                         "random": os.urandom(len(data))}[damage])
    rc, err = _call(["evaluate", "--model", str(copy), "--data", sst2_dev200], capsys)
    assert rc == 1 and str(weights) in err and "truncated or not a safetensors file" in err


def test_a_working_student_still_evaluates(small_student, sst2_dev200, capsys):
    assert main(["evaluate", "--model", str(small_student), "--data", sst2_dev200, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 200 and 0.0 <= out["accuracy"] <= 1.0
