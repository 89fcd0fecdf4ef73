"""Students never run a model's own Python code: every tokenizer and teacher directory a student reads
(named by --tokenizer / --teacher, or by the scored set's teacher_id / tokenizer metadata) goes through
transferset.models.loading's auto_map check. A directory with an auto_map is refused with its message, and with
no opt-in (StudentConfig has no trust_remote_code): otherwise transformers would silently load its
built-in class (bert) in place of the shipped code."""
import json
import shutil

import pytest
import yaml

from conftest import write_scored
from transferset import testing
from transferset.app.cli import main
from transferset.contract import schema

AUTO_MAPS = {
    schema.HF_CONFIG_FILE: {"AutoConfig": "modeling.MyConfig",
                            "AutoModelForSequenceClassification": "modeling.MyModel"},
    "tokenizer_config.json": {"AutoTokenizer": ["tokenization.MyTokenizer", None]},
}
CONFIGS = {
    "bilstm": testing.small_student(report={"latency_examples": 8}),
    "transformer": {"threads": 1, "report": {"latency_examples": 8}, "model": {"n_layer": 2}},
}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, tiny_teacher4) -> dict:
    """{file: a copy of the tiny teacher whose `file` (config.json or tokenizer_config.json) carries an
    auto_map next to its built-in model_type bert}."""
    out = {}
    for file, auto_map in AUTO_MAPS.items():
        d = tmp_path_factory.mktemp("shipped") / "teacher"
        shutil.copytree(tiny_teacher4, d)
        values = json.loads((d / file).read_text())
        (d / file).write_text(json.dumps({**values, "auto_map": auto_map}))
        out[file] = str(d)
    return out


def _train(tmp_path, scored_dir, dev, family, *flags, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CONFIGS[family]))
    rc = main(["train", "--transfer", scored_dir, "--dev", dev, "--output", str(tmp_path / "run"),
               "--student", family, "--config", str(cfg), "--epochs", "1", "--no-progress", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _refused(rc, err, directory, file):
    assert rc == 1, err
    assert f"{directory}/{file}" in err and "auto_map" in err, err
    assert "students do not run a model's own code" in err and "--trust-remote-code" not in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
@pytest.mark.parametrize("file", list(AUTO_MAPS))
def test_train_refuses_a_tokenizer_flag_with_auto_map(tmp_path, tiny_scored_dir, sst2_dev200, shipped, family, file,
                                                      capsys):
    rc, err = _train(tmp_path, tiny_scored_dir, sst2_dev200, family, "--tokenizer", shipped[file], capsys=capsys)
    _refused(rc, err, shipped[file], file)
    assert not (tmp_path / "run" / schema.STUDENT_MODEL_DIR).exists()


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
@pytest.mark.parametrize("file", list(AUTO_MAPS))
def test_train_refuses_a_teacher_flag_with_auto_map(tmp_path, tiny_scored_dir, sst2_dev200, shipped, family, file,
                                                    capsys):
    rc, err = _train(tmp_path, tiny_scored_dir, sst2_dev200, family, "--teacher", shipped[file], capsys=capsys)
    _refused(rc, err, shipped[file], file)


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
def test_a_clean_tokenizer_does_not_let_a_teacher_with_auto_map_through(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                         tiny_teacher4, shipped, family, capsys):
    """The BiLSTM's embeddings and the transformer's config and weights come from the teacher's directory."""
    directory = shipped[schema.HF_CONFIG_FILE]
    rc, err = _train(tmp_path, tiny_scored_dir, sst2_dev200, family, "--tokenizer", tiny_teacher4,
                     "--teacher", directory, capsys=capsys)
    _refused(rc, err, directory, schema.HF_CONFIG_FILE)


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
@pytest.mark.parametrize("file", list(AUTO_MAPS))
def test_train_refuses_a_scored_set_whose_teacher_id_has_auto_map(tmp_path, tiny_scored, sst2_dev200, shipped,
                                                                  family, file, capsys):
    scored = write_scored(tmp_path / "scored", **{**tiny_scored, "teacher_dir": shipped[file]})
    rc, err = _train(tmp_path, str(scored), sst2_dev200, family, capsys=capsys)
    _refused(rc, err, shipped[file], file)


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
def test_train_refuses_a_scored_set_whose_tokenizer_metadata_has_auto_map(tmp_path, tiny_scored, sst2_dev200,
                                                                          shipped, family, capsys):
    directory = shipped["tokenizer_config.json"]
    meta = {**tiny_scored["teacher_meta"], schema.META_TOKENIZER: directory}
    scored = write_scored(tmp_path / "scored", **{**tiny_scored, "teacher_meta": meta})
    rc, err = _train(tmp_path, str(scored), sst2_dev200, family, capsys=capsys)
    _refused(rc, err, directory, "tokenizer_config.json")


def test_a_student_that_reads_nothing_of_the_teacher_still_trains(tmp_path, tiny_scored, sst2_dev200, shipped,
                                                                  capsys):
    """Word tokens and random embeddings load no file of the teacher: nothing is swapped, nothing is refused."""
    scored = write_scored(tmp_path / "scored", **{**tiny_scored, "teacher_dir": shipped[schema.HF_CONFIG_FILE]})
    rc, err = _train(tmp_path, str(scored), sst2_dev200, "bilstm", "--tokens", "words", "--embed-init", "random",
                     capsys=capsys)
    assert rc == 0, err


def test_a_pretrained_student_with_auto_map_is_refused(tmp_path, tiny_scored_dir, sst2_dev200, shipped, capsys):
    directory = shipped["tokenizer_config.json"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"threads: 1\nmodel: {{pretrained: {directory}}}\n")
    rc = main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "run"),
               "--student", "transformer", "--config", str(cfg), "--epochs", "1", "--no-progress"])
    _refused(rc, capsys.readouterr().err, directory, "tokenizer_config.json")


@pytest.mark.parametrize("file", list(AUTO_MAPS))
def test_evaluate_refuses_a_classifier_with_auto_map(shipped, sst2_dev200, file, capsys):
    rc = main(["evaluate", "--model", shipped[file], "--data", sst2_dev200])
    _refused(rc, capsys.readouterr().err, shipped[file], file)
