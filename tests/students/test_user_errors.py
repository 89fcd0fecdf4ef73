"""A user's mistake with `train` or `evaluate` gets one clear message (what, where, what to do), never
a traceback: exit 2 for usage errors, 1 for work that cannot be done."""
import json
import os
from pathlib import Path

import pytest

from transferset import testing
from transferset.contract import schema
from students.data import count_rows
from transferset.app.cli import main
from transferset.runtime.errors import UserError


def _call(args, capsys):
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.fixture(scope="module")
def small_student(tmp_path_factory, tiny_scored_dir, sst2_dev200):
    d = tmp_path_factory.mktemp("small_student")
    testing.write_student_config(str(d / "cfg.yaml"), report={"latency_examples": 8}, vocab={"embed_init": "random"})
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


def _damaged_copy(tmp_path, model_dir, name: str, text: str):
    """A copy of `model_dir` whose file `name` holds `text`; → (the copy, that file)."""
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    target = copy / schema.STUDENT_MODEL_DIR / name if (copy / schema.STUDENT_MODEL_DIR).is_dir() else copy / name
    target.write_text(text, encoding="utf-8")
    return copy, target


def _sidecar(small_student, **changes) -> str:
    values = json.loads((small_student / schema.STUDENT_MODEL_DIR / schema.STUDENT_SIDECAR_FILE).read_text())
    for key, value in changes.items():
        if value is None:
            del values[key]
        else:
            values[key] = value
    return json.dumps(values)


@pytest.mark.parametrize("content, says", [
    ("{oops", "not a JSON file"),
    ("[1, 2]", "a JSON list, not an object"),
    ('"x"', "a JSON string, not an object"),
    ("{}", "lacks"),
    ("label_names", "lacks 'label_names'"),
    ("tokens", "lacks 'tokens'"),
    ("model", "lacks 'model'"),
    ("bad_tokens", "tokens"),
    ("bad_model", "model settings"),
])
def test_a_damaged_sidecar_is_one_clear_message(tmp_path, small_student, sst2_dev200, content, says, capsys):
    content = {"label_names": _sidecar(small_student, label_names=None),
               "tokens": _sidecar(small_student, tokens=None),
               "model": _sidecar(small_student, model=None),
               "bad_tokens": _sidecar(small_student, tokens={"kind": "words"}),
               "bad_model": _sidecar(small_student, model={"no_such_setting": 1})}.get(content, content)
    copy, sidecar = _damaged_copy(tmp_path, small_student, schema.STUDENT_SIDECAR_FILE, content)
    rc, err = _call(["evaluate", "--model", str(copy), "--data", sst2_dev200], capsys)
    assert rc == 1 and str(sidecar) in err and says in err, err
    assert "train the student again" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, says", [
    ("{not json", "not a JSON file"),
    ("[1, 2]", "a JSON list, not an object"),
    ("nosuchmodel", "model_type 'nosuchmodel'"),
])
def test_a_hugging_face_config_that_cannot_load_is_one_clear_message(tmp_path, tiny_teacher4, sst2_dev200,
                                                                      content, says, capsys):
    if content == "nosuchmodel":
        config = json.loads((Path(tiny_teacher4) / schema.HF_CONFIG_FILE).read_text())
        content = json.dumps({**config, "model_type": "nosuchmodel"})
    copy, config_file = _damaged_copy(tmp_path, tiny_teacher4, schema.HF_CONFIG_FILE, content)
    rc, err = _call(["evaluate", "--model", str(copy), "--data", sst2_dev200], capsys)
    assert rc == 1 and str(config_file) in err and says in err, err
    assert "save_pretrained" in err and len(err.strip().splitlines()) == 1


def test_an_onnx_export_whose_config_is_not_an_object_is_one_clear_message(tmp_path, sst2_dev200, capsys):
    pytest.importorskip("onnxruntime")
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    (tmp_path / schema.HF_CONFIG_FILE).write_text("[1, 2]")
    rc, err = _call(["evaluate", "--model", str(tmp_path), "--data", sst2_dev200], capsys)
    assert rc == 1 and str(tmp_path / schema.HF_CONFIG_FILE) in err and "not an object" in err, err


def test_train_into_an_output_another_run_owns_is_refused(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    from transferset.fs.lock import LockInfo

    out = tmp_path / "owned"
    out.mkdir()
    (out / schema.LOCK_FILE).write_bytes(LockInfo(host="another-machine", pid=4242, started=0.0, command="train",
                                                  token="t").to_json())
    rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out),
                     "--epochs", "1"], capsys)
    assert rc == 1 and f"{out} is in use by pid 4242 on host another-machine" in err
    assert sorted(p.name for p in out.iterdir()) == [schema.LOCK_FILE]


def test_pickle_weights_for_evaluate_name_only_flags_that_exist(tmp_path, tiny_teacher4, sst2_dev200, capsys):
    """evaluate has no --allow-pickle: the refusal says where that flag exists instead of advising it."""
    import shutil

    import torch
    from safetensors.torch import load_file

    model = tmp_path / "pickled"
    shutil.copytree(tiny_teacher4, model)
    torch.save(load_file(str(model / schema.WEIGHTS_FILE)), model / "pytorch_model.bin")
    (model / schema.WEIGHTS_FILE).unlink()
    rc, err = _call(["evaluate", "--model", str(model), "--data", sst2_dev200], capsys)
    assert rc == 1 and "pickle files (pytorch_model.bin)" in err
    assert "in `transferset teacher`, `augment` and `score`, pass --allow-pickle" in err and "load safetensors only" in err


def test_a_bilstm_student_given_as_teacher_says_what_it_is(tmp_path, tiny_scored_dir, small_student, sst2_dev200,
                                                         capsys):
    """A BiLSTM student folder as --teacher of a transformer student (or as --tokenizer) is said to be one, in one
    line, exit 2: nothing about sentencepiece."""
    for given in (small_student, small_student / "model"):
        rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output",
                         str(tmp_path / "o"), "--student", "transformer", "--teacher", str(given), "--epochs", "1",
                         "--no-progress"], capsys)
        assert rc == 2, err
        assert "a bilstm student trained by transferset, not a Hugging Face teacher" in err, err
        assert "sentencepiece" not in err.lower() and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "o").exists()
    rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "o"),
                     "--tokenizer", str(small_student / "model")], capsys)
    assert rc == 2 and "a bilstm student trained by transferset, not a Hugging Face tokenizer" in err, err
    assert f"its tokenizer is {small_student / 'model' / 'tokenizer'}" in err and not (tmp_path / "o").exists()


def test_a_student_with_nan_weights_is_refused_by_evaluate_and_predict(tmp_path, small_student, sst2_dev200, capsys):
    """A student with NaN weights (as one trained on NaN logits has) is refused by `evaluate` and `predict`,
    exit 1, naming the weight: no NaN probabilities written with exit 0."""
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "student"
    shutil.copytree(small_student, copy)
    weights = copy / schema.STUDENT_MODEL_DIR / schema.WEIGHTS_FILE
    tensors = load_file(str(weights))
    name = sorted(k for k, t in tensors.items() if t.is_floating_point())[-1]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(weights))
    says = f"{weights}: weight {name} holds NaN or infinite values"
    rc, err = _call(["evaluate", "--model", str(copy), "--data", sst2_dev200], capsys)
    assert rc == 1 and says in err, err
    rc, err = _call(["predict", "--model", str(copy), "--input", sst2_dev200, "--output", str(tmp_path / "p")], capsys)
    assert rc == 1 and says in err, err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("column, value, says", [
    (schema.TEACHER_LOGITS, float("nan"), "teacher_logits holds nan (position 1)"),
    (schema.TEACHER_HIDDEN, float("inf"), "teacher_hidden holds inf (position 1)"),
])
def test_every_reader_of_a_scored_set_refuses_non_finite_teacher_values(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                         small_student, column, value, says, capsys):
    """`evaluate --data`, `train --dev` and `--layer-texts` read a scored set as --transfer does: each refuses
    non-finite teacher values with the check --transfer uses, naming the row."""
    from test_data import _with_a_bad_value

    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, column, 3, value)
    expected = f"{shard}, row 4 (id 'r67'): {says}; a scored set must hold finite teacher values"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("threads: 1\nvocab: {embed_init: random}\nmodel: {embed_dim: 8, hidden: 8}\n")
    train = ["train", "--config", str(cfg), "--epochs", "1", "--no-progress"]
    layer = tmp_path / "layer.yaml"
    layer.write_text(f"student: transformer\nthreads: 1\nmodel: {{n_layer: 2}}\nlosses: {{hidden_mse: 1.0}}\nphases: "
                     f"two-step\nlayer_texts: {scored}\n")
    for args in (["evaluate", "--model", str(small_student), "--data", str(scored)],
                 train + ["--transfer", tiny_scored_dir, "--dev", str(scored), "--output", str(tmp_path / "a")],
                 ["train", "--config", str(layer), "--epochs", "1", "--no-progress", "--transfer", tiny_scored_dir,
                  "--dev", sst2_dev200, "--output", str(tmp_path / "b")]):
        rc = main(args)
        err = capsys.readouterr().err
        assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)
        assert expected in err, (args, err)
    assert not (tmp_path / "a" / schema.STUDENT_MODEL_DIR).exists()
    assert not (tmp_path / "b" / schema.STUDENT_MODEL_DIR).exists()


def test_layer_texts_refuse_what_is_not_a_transfer_set(tmp_path, tiny_scored_dir, sst2_dev200, small_student,
                                                       capsys):
    """`--layer-texts` naming a `predict` output is one line saying it is not a transfer set, not an IndexError
    traceback in count_rows."""
    predicted = tmp_path / "predicted"
    assert main(["predict", "--model", str(small_student), "--input", sst2_dev200, "--output", str(predicted)]) == 0
    capsys.readouterr()
    layer = tmp_path / "layer.yaml"
    layer.write_text(f"student: transformer\nthreads: 1\nmodel: {{n_layer: 2}}\nlosses: {{hidden_mse: 1.0}}\nphases: "
                     f"two-step\nlayer_texts: {predicted}\n")
    rc = main(["train", "--config", str(layer), "--epochs", "1", "--no-progress", "--transfer", tiny_scored_dir,
               "--dev", sst2_dev200, "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{predicted} is not a transfer set: {predicted / schema.DATA_DIR}" in err
    assert "run `transferset augment` / `score` to make one" in err
    with pytest.raises(UserError, match="not a transfer set"):
        count_rows(str(predicted))


def test_a_teacher_url_of_a_web_server_is_a_usage_error_that_fits_http(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                      capsys):
    """An http:// teacher or tokenizer is a usage error (exit 2) that fits http: a web server holds no folder to
    read, so no gcsfs suggestion."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("tokenizer: https://example.com/tok\n")
    for flags, where in ((["--teacher", "http://example.com/x"], "--teacher=http://example.com/x"),
                         (["--config", str(cfg)], f"{cfg}: tokenizer=https://example.com/tok")):
        rc, err = _call(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200,
                         "--output", str(tmp_path / "o"), *flags], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{where}: an http" in err and "names one file on a web server" in err and "gcsfs" not in err, err
        assert not (tmp_path / "o").exists()
