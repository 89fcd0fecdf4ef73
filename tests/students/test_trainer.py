"""`transferset train` / `evaluate` end to end on a scored set built from 1,000 SST-2 rows."""
import json
import re

import numpy as np
import pytest

from transferset.config import StudentConfig
import torch

from students import trainer
from students.trainer import load_student, save_student, setup
from transferset import schema
from transferset.cli import main


@pytest.fixture(scope="module")
def bilstm_run(tmp_path_factory, scored_dir, sst2_dev, small_bilstm_config):
    out = tmp_path_factory.mktemp("bilstm_run")
    cfg = small_bilstm_config(out / "cfg.yaml")
    rc = main(["train", "--transfer", scored_dir, "--dev", sst2_dev, "--output", str(out / "run"),
               "--student", "bilstm", "--config", cfg, "--epochs", "4", "--patience", "2", "--seed", "0",
               "--no-progress"])
    assert rc == 0
    return out / "run"


def test_bilstm_from_the_cache_beats_the_majority_class_by_a_clear_margin(bilstm_run):
    m = json.loads((bilstm_run / "metrics.json").read_text())
    assert m["dev_rows"] == 872
    assert m["dev_majority_baseline"] == pytest.approx(444 / 872)  # SST-2 dev: 444 positive
    assert m["dev_accuracy"] >= m["dev_majority_baseline"] + 0.10, m["dev_accuracy"]
    assert 0.5 < m["teacher_agreement"] <= 1.0
    assert m["transfer"]["rows"] == 1000 and m["transfer"]["labeled_rows"] == 750


def test_metrics_report_size_latency_and_history(bilstm_run):
    m = json.loads((bilstm_run / "metrics.json").read_text())
    student = load_student(str(bilstm_run))
    assert m["parameters"] == sum(p.numel() for p in student.model.parameters())
    assert m["latency_ms_per_example"]["batch_1"] > 0
    # Batching amortises the per-call overhead.
    assert m["latency_ms_per_example"]["batch_64"] < m["latency_ms_per_example"]["batch_1"]
    epochs = m["history"]
    assert 1 <= len(epochs) <= 4 and [h["epoch"] for h in epochs] == list(range(1, len(epochs) + 1))
    assert all(set(h["losses"]) == {"ce", "mse"} for h in epochs)
    # The kept checkpoint is the best epoch's: the final dev accuracy equals the best in the history.
    assert m["dev_accuracy"] == max(h["dev_accuracy"] for h in epochs)
    assert (bilstm_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    files = {p.name for p in (bilstm_run / "model").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer"} <= files


def test_evaluate_prints_the_training_dev_accuracy_and_teacher_agreement(bilstm_run, sst2_dev, scored_dir, capsys):
    m = json.loads((bilstm_run / "metrics.json").read_text())
    assert main(["evaluate", "--model", str(bilstm_run), "--data", sst2_dev]) == 0
    out = capsys.readouterr().out
    # Reloaded from disk, the student makes exactly the predictions it made in memory.
    assert f"accuracy {m['dev_accuracy']:.4f} (872 labeled rows of 872)" in out
    assert "teacher agreement" not in out  # the TSV has no teacher columns
    assert main(["evaluate", "--model", str(bilstm_run), "--data", scored_dir, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rows"] == 1000 and res["labeled_rows"] == 750
    assert res["teacher_agreement"] == pytest.approx(m["teacher_agreement"])  # same rows: the first 1000


@pytest.mark.parametrize("student,extra", [
    ("bilstm", {"tokens": "wordpiece"}),
    ("bilstm", {"tokens": "words", "preset": "tang", "mse": 1.0}),
    ("transformer", {"model": {"n_layer": 2}}),
])
def test_save_load_gives_identical_predictions(tmp_path, small_scored_dir, sst2_dir, student, extra):
    values = {"student": student, "threads": 1, **extra}
    if student == "bilstm" and "preset" not in extra:
        values["model"] = {"embed_dim": 32, "hidden": 16}
    s = setup(StudentConfig(**values), small_scored_dir)
    batch = next(trainer.iter_train_batches(s, small_scored_dir, seed=0))
    opt = trainer.make_optimizer(s.cfg, [p for p in s.model.parameters()])
    trainer.train_step(s.model, opt, batch, s.cfg.loss_weights(), 1.0)  # not the initial weights
    save_student(str(tmp_path / "model"), s)
    texts = [line.split("\t")[0] for line in (sst2_dir / "dev.tsv").read_text().splitlines()[1:101]]
    before = trainer.Student(s.model, s.tokens, s.label_names).logits(texts)
    after = load_student(str(tmp_path)).logits(texts)
    assert np.array_equal(before, after)
    assert len(set(np.round(before[:, 0], 5))) > 10  # not a constant function


def test_progressive_schedule_runs_its_seven_phases_in_order(tmp_path, scored_dir, sst2_dev, small_bilstm_config):
    out = tmp_path / "run"
    cfg = small_bilstm_config(tmp_path / "cfg.yaml", model={"embed_dim": 32, "hidden": 32})
    rc = main(["train", "--transfer", scored_dir, "--dev", sst2_dev, "--output", str(out), "--schedule",
               "progressive", "--config", cfg, "--epochs", "1", "--no-progress"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert [(p["stage"], p["trainable"]) for p in m["phases"]] == [
        (1, ["embeddings", "encoder", "head"]),
        (2, ["head", "classifier"]), (2, ["encoder", "head", "classifier"]),
        (2, ["embeddings", "encoder", "head", "classifier"]),
        (3, ["head", "classifier"]), (3, ["encoder", "head", "classifier"]),
        (3, ["embeddings", "encoder", "head", "classifier"]),
    ]
    assert [list(h["losses"]) for h in m["history"]] == [["repr"]] + [["mse"]] * 3 + [["ce"]] * 3
    # Each unfreezing step keeps its best dev checkpoint (the one it started from included),
    # and the next step starts from exactly that model.
    steps = m["phases"][1:]
    assert all(p["best_dev_accuracy"] >= p["start_dev_accuracy"] for p in steps)
    assert [p["start_dev_accuracy"] for p in steps[1:]] == [p["best_dev_accuracy"] for p in steps[:-1]]
    assert m["dev_accuracy"] == steps[-1]["best_dev_accuracy"]
    assert m["dev_accuracy"] > m["dev_majority_baseline"]


def test_transformer_student_with_pkd_trains_from_teacher_layers(tmp_path, small_scored_dir, sst2_dev):
    out = tmp_path / "run"
    dev = tmp_path / "dev200.tsv"  # the transformer's dev pass costs ~10× the BiLSTM's
    with open(sst2_dev, encoding="utf-8") as fh:
        dev.write_text("".join(fh.readlines()[:201]))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("threads: 1\nlatency_examples: 16\npkd: 1.0\nkd: 1.0\nmse: 0\ntemperature: 2.0\n"
                   "model: {n_layer: 3, init: skip}\n")
    rc = main(["train", "--transfer", small_scored_dir, "--dev", str(dev), "--output", str(out),
               "--student", "transformer", "--config", str(cfg), "--epochs", "1", "--no-progress"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert set(m["history"][0]["losses"]) == {"ce", "kd", "pkd"} and m["dev_rows"] == 200
    assert m["model_config"]["n_layer"] == 3 and m["model_config"]["teacher_layers"] == 6
    assert 0 < m["history"][0]["losses"]["pkd"] < 4  # unit vectors: at most 4 apart squared
    # Initialised from MiniLM layers 2, 4, 6, the student already agrees with the teacher's [CLS].
    assert m["history"][0]["losses"]["pkd"] < 0.5


def test_streaming_visits_every_row_once_with_a_bounded_buffer(scored_dir, monkeypatch):
    s = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, shuffle_rows=100, batch_size=16), scored_dir)
    held = []
    real = trainer._table_arrays
    monkeypatch.setattr(trainer, "_table_arrays", lambda table, st: held.append(table.num_rows) or real(table, st))
    seen = []
    labels = []
    for batch in trainer.iter_train_batches(s, scored_dir, seed=1):
        seen.append(batch[schema.TEACHER_LOGITS])
        labels.append(batch[schema.LABEL])
    assert sum(held) == 1000 and max(held) < 200  # never more than shuffle_rows + one record batch
    logits = torch.cat(seen)
    assert logits.shape == (1000, 2) and len({tuple(r.tolist()) for r in logits}) == 1000
    assert int((torch.cat(labels) == -1).sum()) == 250
    labeled = list(trainer.iter_train_batches(s, scored_dir, seed=1, labeled_only=True))
    assert sum(len(b[schema.LABEL]) for b in labeled) == 750
    assert all(bool((b[schema.LABEL] >= 0).all()) for b in labeled)
    # Another epoch seed, another order.
    first = next(trainer.iter_train_batches(s, scored_dir, seed=2))[schema.TEACHER_LOGITS]
    assert not torch.equal(first, seen[0][: len(first)])


# --------------------------------------------------------------------------- refusals


def _train(args, capsys):
    rc = main(["train", "--no-progress", *args])
    return rc, capsys.readouterr().err


def test_refuses_a_transfer_set_without_teacher_columns(tmp_path, make_scored, sst2_dev, capsys):
    unscored = make_scored(tmp_path / "unscored", rows=50, drop_teacher=True)
    rc, err = _train(["--transfer", unscored, "--dev", sst2_dev, "--output", str(tmp_path / "o")], capsys)
    assert rc == 1
    assert f"missing column(s) {list(schema.TEACHER_COLUMNS)}" in err
    assert "run `transferset score` on it first" in err and "part-00000.parquet" in err


def test_refuses_label_names_that_differ_from_the_dev_data(tmp_path, make_scored, sst2_dev, capsys):
    other = make_scored(tmp_path / "other", rows=50, label_names=("negative", "positive"))
    rc, err = _train(["--transfer", other, "--dev", sst2_dev, "--output", str(tmp_path / "o")], capsys)
    assert rc == 1
    assert "label names ['0', '1'] differ" in err and "['negative', 'positive']" in err and "dev.tsv" in err


def test_refuses_a_set_without_the_pkd_layers(tmp_path, small_scored_dir, sst2_dev, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("pkd: 1.0\nmodel: {n_layer: 2}\n")
    rc, err = _train(["--transfer", small_scored_dir, "--dev", sst2_dev, "--output", str(tmp_path / "o"),
                      "--student", "transformer", "--config", str(cfg)], capsys)
    assert rc == 1
    assert "layers [3, 6]" in err and "has layers [2, 4, 6]" in err and "--layers 3,6" in err


def test_refuses_unknown_settings_and_an_existing_output(tmp_path, scored_dir, sst2_dev, bilstm_run, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("epoch: 3\n")
    rc, err = _train(["--transfer", scored_dir, "--dev", sst2_dev, "--output", str(tmp_path / "o"),
                      "--config", str(cfg)], capsys)
    assert rc == 2 and f"{cfg}: epoch: unknown setting; known:" in err and "epochs" in err
    cfg.write_text("epochs: abc\n")
    rc, err = _train(["--transfer", scored_dir, "--dev", sst2_dev, "--output", str(tmp_path / "o"),
                      "--config", str(cfg)], capsys)
    assert rc == 2 and f"{cfg}: epochs = 'abc'" in err and "(expected int)" in err
    cfg.write_text("model: {hiden: 3}\n")
    rc, err = _train(["--transfer", scored_dir, "--dev", sst2_dev, "--output", str(tmp_path / "o"),
                      "--config", str(cfg)], capsys)
    assert rc == 1 and "unknown BiLSTM setting(s) ['hiden']" in err
    cfg.write_text("preset: tang\n")  # FC 200: no representation head of the teacher's width (384)
    rc, err = _train(["--transfer", scored_dir, "--dev", sst2_dev, "--output", str(tmp_path / "o"),
                      "--config", str(cfg), "--schedule", "progressive"], capsys)
    assert rc == 1 and "head width (200) to equal the teacher's hidden width (384)" in err
    rc, err = _train(["--transfer", scored_dir, "--dev", sst2_dev, "--output", str(bilstm_run)], capsys)
    assert rc == 1 and re.search(r"model already exists; pass --overwrite", err)
    rc, err = _train(["--transfer", str(tmp_path), "--dev", sst2_dev, "--output", str(tmp_path / "o")], capsys)
    assert rc == 1 and "no Parquet files" in err


def test_evaluate_refuses_data_with_other_label_names(tmp_path, make_scored, bilstm_run, capsys):
    other = make_scored(tmp_path / "other", rows=50, label_names=("negative", "positive"))
    assert main(["evaluate", "--model", str(bilstm_run), "--data", other]) == 1
    err = capsys.readouterr().err
    assert "label names ['negative', 'positive'] differ" in err and "['0', '1']" in err
    assert main(["evaluate", "--model", str(tmp_path), "--data", other]) == 1
    assert "no model/config.json" in capsys.readouterr().err


def test_read_eval_data_reads_sentence_pairs_and_skips_bad_rows(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\na b\tc d\t1\nonly one field\ne\tf\t0\n")
    data = trainer.read_eval_data(str(path), ["0", "1"], text_column="sentence1", text_b_column="sentence2")
    assert data.texts == ["a b", "e"] and data.texts_b == ["c d", "f"] and data.labels.tolist() == [1, 0]
    assert data.teacher_labels is None
