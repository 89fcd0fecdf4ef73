"""`transferset train` / `evaluate` end to end.

Fast tests use 128 SST-2 rows scored by a tiny 4-layer teacher; the integration tests use 1,000
rows scored by MiniLM and check that distillation learns.
"""
import json
import re

import pytest

from transferset import testing
from transferset.app.cli import main
from transferset.contract import schema

from conftest import write_scored

FAST = {"threads": 1, "report": {"latency_examples": 16}}


def _config(path, **values):
    import yaml

    path.write_text(yaml.safe_dump({**FAST, **values}))
    return str(path)


def _run(tmp_path, scored, dev, *args, **values):
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "run"
    rc = main(["train", "--transfer", scored, "--dev", dev, "--output", str(out), "--no-progress",
               "--config", _config(tmp_path / "cfg.yaml", **values), *args])
    assert rc == 0
    return out, json.loads((out / schema.METRICS_FILE).read_text())


# --------------------------------------------------------------------------- fast


def test_a_run_writes_model_metrics_and_curves(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "2", model={"embed_dim": 16, "hidden": 16})
    assert m["student"] == "bilstm" and m["dev_rows"] == 200
    # the phase plan is a setting (config.phases); `phases` is what each phase ran, as the summary printed says
    assert m["config"]["phases"] == "joint" and [p["epochs_run"] for p in m["phases"]] == [2] and "schedule" not in m
    summary = json.loads(capsys.readouterr().out)
    assert (summary["student"], summary["phases"], summary["dev_accuracy"]) == ("bilstm", "joint", m["dev_accuracy"])
    assert m["dev_majority_baseline"] == pytest.approx(105 / 200)  # the first 200 SST-2 dev rows: 105 negative
    assert m["transfer"]["rows"] == 128 and m["transfer"]["labeled_rows"] == 96
    assert [h["epoch"] for h in m["history"]] == [1, 2] and all(set(h["losses"]) == {"ce", "mse"} for h in m["history"])
    assert m["dev_accuracy"] == max(h["dev_accuracy"] for h in m["history"])  # the best epoch is kept
    assert [h["rows"] for h in m["history"]] == [128, 128] and m["train_rows"] == 256  # every row once an epoch
    assert m["train_rows_per_second"] > 0
    assert (out / schema.CURVES_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    files = {p.name for p in (out / schema.STUDENT_MODEL_DIR).iterdir()}
    assert {schema.WEIGHTS_FILE, schema.STUDENT_SIDECAR_FILE, "tokenizer"} <= files


def test_the_recorded_effective_batch_is_the_one_that_ran(tmp_path, tiny_scored_dir, sst2_dev200):
    """A batch_size of 100,000 on 527 rows recorded an effective batch of 100,000: a step took every row."""
    _, m = _run(tmp_path / "whole", tiny_scored_dir, sst2_dev200, "--epochs", "1", "--batch-size", "100000",
                model={"embed_dim": 8, "hidden": 8})
    assert m["history"][0]["rows"] == 128 and m["effective_batch_size"] == 128
    # four batches of 32, two a step
    _, m = _run(tmp_path / "accumulated", tiny_scored_dir, sst2_dev200, "--epochs", "1", "--batch-size", "32",
                "--grad-accum", "2", model={"embed_dim": 8, "hidden": 8})
    assert m["history"][0]["step"] == 2 and m["effective_batch_size"] == 64


def test_a_run_checks_and_counts_its_scored_set_once(tmp_path, tiny_scored_dir, sst2_dev200, monkeypatch):
    """Before its first step the trainer opens and counts the scored set once (students.data.ScoredSet.open), not
    six times with one a full pass. The model card reads the set's records again afterwards."""
    from students import data, trainer

    passes, opens, before_step_1 = [], [], []
    count, read_metadata, plan_phases = data._count, data.transfer.read_metadata, trainer.plan_phases
    monkeypatch.setattr(data, "_count", lambda *a: passes.append(a[0]) or count(*a))
    monkeypatch.setattr(data.transfer, "read_metadata", lambda *a, **k: opens.append(a[0]) or read_metadata(*a, **k))
    monkeypatch.setattr(trainer, "plan_phases", lambda *a: before_step_1.extend(opens) or plan_phases(*a))
    _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "1", model={"embed_dim": 16, "hidden": 16})
    assert passes == [tiny_scored_dir] and before_step_1 == [tiny_scored_dir]


def test_the_training_time_latency_says_what_it_was_taken_under(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    """metrics.json's latency is taken the report's way (one thread) and carries its conditions, not timed on
    the training threads with no load recorded; the training's threads are set back afterwards."""
    import torch

    threads = torch.get_num_threads()
    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "1", threads=2,
                  model={"embed_dim": 16, "hidden": 16})
    assert set(m["latency_ms_per_example"]) == {"batch_1", "batch_64"}
    assert all(v > 0 for v in m["latency_ms_per_example"].values())
    cond = m["latency_conditions"]
    assert cond["threads"] == 1 and cond["cpu_count"] >= 1 and isinstance(cond["busy"], bool)
    assert len(cond["load_average_before"]) == 3 and cond["cpu_share"] > 0
    assert "alone at training time" in cond["note"] and "run report" in cond["note"]
    assert "latency_note" not in m
    printed = json.loads(capsys.readouterr().out)  # `transferset train` prints them with the figures
    assert printed["latency_conditions"] == cond
    assert torch.get_num_threads() == 2  # the training's setting again after the timing
    torch.set_num_threads(threads)


def test_no_progress_drops_the_bar_not_the_epoch_lines(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    """`--no-progress` printed nothing at all until the summary: a long run in a log looked dead."""
    _, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "2", model={"embed_dim": 16, "hidden": 16})
    err = capsys.readouterr().err
    lines = re.findall(r"^joint epoch (\d): train loss [0-9.]+, dev accuracy ([0-9.]+)", err, flags=re.M)
    assert [int(e) for e, _ in lines] == [1, 2]
    assert [float(a) for _, a in lines] == pytest.approx([h["dev_accuracy"] for h in m["history"]], abs=1e-4)
    assert "\r" not in err  # no bar


def test_the_seed_fixes_the_run(tmp_path, tiny_scored_dir, sst2_dev200):
    settings = dict(model={"embed_dim": 16, "hidden": 16}, vocab={"embed_init": "random"})
    runs = [_run(tmp_path / str(i), tiny_scored_dir, sst2_dev200, "--epochs", "1", "--seed", str(seed), **settings)[1]
            for i, seed in enumerate((5, 5, 6))]
    losses = [r["history"][0]["losses"] for r in runs]
    assert losses[0] == losses[1] and runs[0]["dev_accuracy"] == runs[1]["dev_accuracy"]
    assert losses[0] != losses[2]


def test_transformer_with_pkd_trains_and_saves_a_hugging_face_model(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    from transformers import AutoModelForSequenceClassification

    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--student", "transformer", "--epochs", "1",
                  losses={"ce": 1.0, "pkd": 1.0, "kd": {"weight": 1.0, "temperature": 2.0}}, model={"n_layer": 2, "init": "skip"})
    assert set(m["history"][0]["losses"]) == {"ce", "kd", "pkd"}
    assert m["model_config"]["n_layer"] == 2 and m["model_config"]["teacher_layers"] == 4
    assert 0 < m["history"][0]["losses"]["pkd"] < 4  # unit vectors: at most 4 apart squared
    model = AutoModelForSequenceClassification.from_pretrained(out / schema.STUDENT_MODEL_DIR)
    assert model.config.num_hidden_layers == 2
    capsys.readouterr()  # train's summary
    assert main(["evaluate", "--model", str(out), "--data", sst2_dev200, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(m["dev_accuracy"])


def _train(args, capsys):
    rc = main(["train", "--no-progress", *args])
    return rc, capsys.readouterr().err


def test_refuses_a_transfer_set_without_teacher_columns(tmp_path, tiny_scored, sst2_dev200, capsys):
    unscored = str(write_scored(tmp_path / "unscored", **{**tiny_scored, "drop_teacher": True}))
    rc, err = _train(["--transfer", unscored, "--dev", sst2_dev200, "--output", str(tmp_path / "o")], capsys)
    assert rc == 1
    assert f"missing column(s) {list(schema.TEACHER_COLUMNS)}" in err
    assert "run `transferset score` on it first" in err and "part-00000.parquet" in err


def test_refuses_an_incomplete_scored_set_unless_allowed(tmp_path, tiny_scored, sst2_dev200, capsys):
    killed = str(write_scored(tmp_path / "killed", **{**tiny_scored, "complete": False}))
    args = ["--transfer", killed, "--dev", sst2_dev200, "--output", str(tmp_path / "o"), "--epochs", "1",
            "--config", str(tmp_path / "small.yaml"), "--no-progress"]
    testing.write_student_config(str(tmp_path / "small.yaml"), vocab={"embed_init": "random"})
    rc, err = _train(args, capsys)
    assert rc == 1 and f"{killed} is incomplete: no" in err and schema.COMPLETE_MARKER in err
    assert "--allow-incomplete" in err and not (tmp_path / "o").exists()
    rc, err = _train(args + ["--allow-incomplete"], capsys)
    assert rc == 0 and (tmp_path / "o" / schema.METRICS_FILE).exists()


def test_refuses_label_names_that_differ_from_the_dev_data(tmp_path, tiny_scored, sst2_dev200, capsys):
    other = str(write_scored(tmp_path / "other", **{**tiny_scored, "label_names": ("negative", "positive")}))
    rc, err = _train(["--transfer", other, "--dev", sst2_dev200, "--output", str(tmp_path / "o")], capsys)
    assert rc == 1
    assert "label names ['0', '1'] differ" in err and "['negative', 'positive']" in err and "dev.tsv" in err
    # evaluate refuses such data for a model with other label names too
    assert main(["evaluate", "--model", tiny_scored["teacher_dir"], "--data", other]) == 1
    err = capsys.readouterr().err
    assert "label names ['negative', 'positive'] differ" in err and "['0', '1']" in err


def test_refuses_unknown_settings_and_an_existing_output(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    cfg = tmp_path / "cfg.yaml"
    args = ["--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "o"), "--config", str(cfg)]
    cfg.write_text("epoch: 3\n")
    rc, err = _train(args, capsys)
    assert rc == 2 and f"{cfg}: epoch: unknown setting; known:" in err and "epochs" in err
    cfg.write_text("epochs: abc\n")
    rc, err = _train(args, capsys)
    assert rc == 2 and f"{cfg}: epochs = 'abc'" in err and "(expected int)" in err
    cfg.write_text("model: {shape: tang}\n")  # FC 200: no representation head of the teacher's width (32)
    rc, err = _train(args + ["--phases", "progressive"], capsys)
    assert rc == 1 and "head width (200) to equal the teacher's hidden width (32)" in err
    (tmp_path / "o" / schema.STUDENT_MODEL_DIR).mkdir(parents=True)
    (tmp_path / "o" / schema.STUDENT_MODEL_DIR / "notes.txt").write_text("mine")
    cfg.write_text("epochs: 1\n")
    for flags in ([], ["--overwrite"]):  # model/ is the trainer's: another's files there are never deleted
        rc, err = _train(args + flags, capsys)
        assert rc == 1 and re.search(r"o holds model/ \(notes.txt\), which transferset did not write", err)
    assert (tmp_path / "o" / schema.STUDENT_MODEL_DIR / "notes.txt").read_text() == "mine"
    rc, err = _train(["--transfer", str(tmp_path), "--dev", sst2_dev200, "--output", str(tmp_path / "p")], capsys)
    assert rc == 1 and "no Parquet files" in err


def test_a_killed_train_is_redone_without_overwrite(tmp_path, tiny_scored_dir, sst2_dev200, capsys, monkeypatch):
    """A `train` killed after creating model/ does not block its own rerun ("model already exists"): an
    unfinished output of the same command is ours to redo, without --overwrite."""
    import students.trainer

    small = {"model": {"embed_dim": 16, "hidden": 16}}
    out = tmp_path / "run"
    (out / schema.STUDENT_MODEL_DIR).mkdir(parents=True)  # what a killed run of the released version left
    _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "1", **small)
    assert (out / schema.COMPLETE_MARKER).exists()
    assert (out / schema.STUDENT_MODEL_DIR / schema.STUDENT_SIDECAR_FILE).exists()

    def killed(*args, **kwargs):  # killed while saving: model/ and metrics.json written, no _COMPLETE
        raise KeyboardInterrupt

    monkeypatch.setattr(students.trainer, "plot_curves", killed)
    args = ["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out), "--no-progress",
            "--config", _config(tmp_path / "cfg.yaml", **small), "--epochs", "1"]
    assert main(args + ["--overwrite"]) == 130
    assert (out / schema.STUDENT_MODEL_DIR).is_dir() and not (out / schema.COMPLETE_MARKER).exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert main(args) == 0  # no --overwrite needed: the folder holds only what the killed run wrote
    assert (out / schema.COMPLETE_MARKER).exists() and (out / schema.CURVES_FILE).exists()
    assert main(args) == 1  # complete now: kept unless --overwrite
    assert "already holds a complete run of `transferset train` (a trained student)" in capsys.readouterr().err


# --------------------------------------------------------------------------- integration: MiniLM teacher


@pytest.fixture(scope="module")
def bilstm_run(tmp_path_factory, scored_dir, sst2_dev, small_bilstm_config):
    out = tmp_path_factory.mktemp("bilstm_run")
    cfg = small_bilstm_config(out / "cfg.yaml")
    rc = main(["train", "--transfer", scored_dir, "--dev", sst2_dev, "--output", str(out / "run"),
               "--student", "bilstm", "--config", cfg, "--epochs", "4", "--patience", "2", "--seed", "0",
               "--no-progress"])
    assert rc == 0
    return out / "run"


@pytest.mark.integration
def test_bilstm_from_the_cache_beats_the_majority_class_by_a_clear_margin(bilstm_run):
    m = json.loads((bilstm_run / schema.METRICS_FILE).read_text())
    assert m["dev_rows"] == 872
    assert m["dev_accuracy"] > m["dev_majority_baseline"] + 0.1
    assert m["teacher_agreement"] > 0.7
    epochs = m["history"]
    assert 1 <= len(epochs) <= 4 and [h["epoch"] for h in epochs] == list(range(1, len(epochs) + 1))
    assert m["dev_accuracy"] == max(h["dev_accuracy"] for h in epochs)


@pytest.mark.integration
def test_evaluate_prints_the_training_dev_accuracy_and_teacher_agreement(bilstm_run, sst2_dev, scored_dir, capsys):
    m = json.loads((bilstm_run / schema.METRICS_FILE).read_text())
    assert main(["evaluate", "--model", str(bilstm_run), "--data", sst2_dev]) == 0
    out = capsys.readouterr().out
    # Reloaded from disk, the student makes exactly the predictions it made in memory.
    assert f"accuracy {m['dev_accuracy']:.4f} (872 labeled rows of 872)" in out
    assert "teacher agreement" not in out  # the TSV has no teacher columns
    assert main(["evaluate", "--model", str(bilstm_run), "--data", scored_dir, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rows"] == 1000 and res["labeled_rows"] == 750
    assert res["teacher_agreement"] == pytest.approx(m["teacher_agreement"])  # same rows: the first 1000


@pytest.mark.integration
def test_progressive_schedule_runs_its_seven_phases_in_order(tmp_path, scored_dir, sst2_dev, small_bilstm_config):
    out = tmp_path / "run"
    cfg = small_bilstm_config(tmp_path / "cfg.yaml", model={"embed_dim": 32, "hidden": 32})
    rc = main(["train", "--transfer", scored_dir, "--dev", sst2_dev, "--output", str(out), "--phases",
               "progressive", "--config", cfg, "--epochs", "1", "--no-progress"])
    assert rc == 0
    m = json.loads((out / schema.METRICS_FILE).read_text())
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


@pytest.mark.integration
def test_transformer_student_with_pkd_trains_from_minilm_layers(tmp_path, small_scored_dir, sst2_dev):
    from transformers import pipeline

    dev = tmp_path / "dev200.tsv"  # the transformer's dev pass costs ~10× the BiLSTM's
    with open(sst2_dev, encoding="utf-8") as fh:
        dev.write_text("".join(fh.readlines()[:201]))
    out, m = _run(tmp_path, small_scored_dir, str(dev), "--student", "transformer", "--epochs", "1",
                  losses={"ce": 1.0, "pkd": 1.0, "kd": {"weight": 1.0, "temperature": 2.0}}, model={"n_layer": 3, "init": "skip"})
    assert set(m["history"][0]["losses"]) == {"ce", "kd", "pkd"} and m["dev_rows"] == 200
    assert m["model_config"]["n_layer"] == 3 and m["model_config"]["teacher_layers"] == 6
    # Initialised from MiniLM layers 2, 4, 6, the student already agrees with the teacher's [CLS].
    assert 0 < m["history"][0]["losses"]["pkd"] < 0.5
    # The saved student is MiniLM-sized Hugging Face model with 3 layers; a pipeline agrees with evaluate.
    from students.student import Student

    texts = [line.split("\t")[0] for line in dev.read_text().splitlines()[1:]]
    ours = Student.from_pretrained(str(out)).predict(texts)
    clf = pipeline("text-classification", model=str(out / schema.STUDENT_MODEL_DIR), device="cpu")
    assert [r["label"] for r in clf(texts, batch_size=32, truncation=True)] == ours.labels
