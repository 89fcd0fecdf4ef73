import json
import os
import random

import numpy as np
import pytest

from transferset.app import cli
from transferset.errors import UserError
import builders as testing
from transferset import loading, progress, schema
from transferset.schema import METRICS_FILE
from transferset.teacher import scoring
from transferset.config import TeacherConfig
from transferset.teacher.train import total_steps, train, training_arguments

POSITIVE = ["great", "brilliant", "best", "love", "funny"]
NEGATIVE = ["awful", "terrible", "worst", "hate", "boring"]
FILLER = ["the", "movie", "film", "story", "was", "is", "very", "so", "acting", "plot"]


def _rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        words = rng.sample(FILLER, 3) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        rows.append((" ".join(words), str(label)))
    return rows


def _write_tsv(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("sentence\tlabel\n")
        for text, label in rows:
            fh.write(f"{text}\t{label}\n")
        for line in extra_lines:
            fh.write(line + "\n")
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    base = testing.tiny_classifier(str(tmp / "base"), label_names=("LABEL_0", "LABEL_1"),
                                  initializer_range=0.02)
    train_tsv = _write_tsv(tmp / "train.tsv", _rows(96, 0))
    # Two bad dev rows: an empty sentence and a label outside the train file's label set.
    dev_tsv = _write_tsv(tmp / "dev.tsv", _rows(40, 1), extra_lines=["\t1", "great film\t7"])
    cfg = TeacherConfig(model=base, epochs=5, lr=1e-2, batch_size=16, max_length=32, seed=0, progress=False)
    out = str(tmp / "teacher")
    messages = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progress, "EVERY_S", 0.0)  # a progress line after every step instead of every 30 s
        metrics = train(cfg, train=train_tsv, dev=dev_tsv, output=out, log=messages.append)
    return (cfg, out), metrics, {"train": train_tsv, "dev": dev_tsv, "messages": messages}


def test_fine_tuning_learns_and_keeps_best_checkpoint(trained):
    (cfg, output), metrics, _ = trained
    history = metrics["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    assert [h["step"] for h in history] == [6, 12, 18, 24, 30]  # 96 rows / batch 16
    best = max(history, key=lambda h: h["dev_accuracy"])  # the first of equal bests is kept
    assert metrics["best_dev_accuracy"] == best["dev_accuracy"] and metrics["best_epoch"] == best["epoch"]
    # The keyword task is easy: a tiny model that learns anything gets well above chance.
    assert metrics["best_dev_accuracy"] >= 0.9
    with open(os.path.join(output, METRICS_FILE)) as fh:
        assert json.load(fh)["best_dev_accuracy"] == metrics["best_dev_accuracy"]

    # The saved weights are that checkpoint: rescoring dev gives the recorded accuracy.
    teacher = scoring.Teacher.load(output)
    dev = _rows(40, 1)
    pred = teacher.predict([t for t, _ in dev]).labels
    assert np.mean(pred == np.array([int(l) for _, l in dev])) == pytest.approx(metrics["best_dev_accuracy"])


def test_saved_directory_is_a_safe_teacher(trained):
    (cfg, output), metrics, _ = trained
    names = set(os.listdir(output))
    assert {"config.json", "model.safetensors", "tokenizer_config.json", METRICS_FILE} <= names
    assert not any(n.endswith(".bin") for n in names)
    config = loading.load_config(output)
    assert loading.label_names_of(config) == ["0", "1"]  # the data's labels, not the base model's
    assert metrics["label_names"] == ["0", "1"]
    assert metrics["weights_sha256"] == loading.weights_sha256(output)
    assert metrics["max_length"] == 32


def test_rejected_rows_are_reported(trained):
    (cfg, output), metrics, _ = trained
    assert metrics["rejected"] == {"train": 0, "dev": 2}
    assert metrics["dev_rows"] == 40 and metrics["train_rows"] == 96
    with open(os.path.join(output, "rejects", "dev.jsonl")) as fh:
        reasons = [json.loads(line)["reason"] for line in fh]
    assert reasons[0] == "empty text"
    assert reasons[1].startswith("label '7' outside the label set")


def test_existing_output_refused(trained):
    (cfg, output), _, _ = trained
    with pytest.raises(UserError, match=r"already holds a complete run of `transferset teacher` \(a fine-tuned teacher model\).*--overwrite"):
        train(cfg, train="unused.tsv", dev="unused.tsv", output=output, log=lambda msg: None)


def test_cli_runs_and_limits_rows(tmp_path, tiny_teacher, capsys):
    train_tsv = _write_tsv(tmp_path / "train.tsv", _rows(30, 2))
    dev_tsv = _write_tsv(tmp_path / "dev.tsv", _rows(30, 3))
    out = tmp_path / "teacher"
    rc = cli.main(["teacher", "--train", train_tsv, "--dev", dev_tsv, "--output", str(out), "--model", tiny_teacher,
                   "--epochs", "1", "--batch-size", "4", "--limit", "12", "--max-steps", "2", "--seed", "3"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_rows"] == 12 and summary["dev_rows"] == 12
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert metrics["history"][0]["step"] == 2


def test_cli_error_is_clean(tmp_path, capsys):
    rc = cli.main(["teacher", "--train", str(tmp_path / "missing.tsv"), "--dev", str(tmp_path / "d.tsv"),
                   "--output", str(tmp_path / "o")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "transferset teacher: error: --train" in err and "missing.tsv: no such file" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_teacher_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["teacher", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--train", "--dev", "--output", "--model", "--epochs", "--lr", "--batch-size", "--max-length",
                 "--limit", "--seed", "--allow-pickle", "--trust-remote-code"):
        assert flag in text
    assert loading.DEFAULT_MODEL in text


def test_metrics_record_the_input_files(trained):
    _, metrics, inputs = trained
    assert metrics["train"] == inputs["train"]
    assert metrics["dev"] == inputs["dev"]  # once overwritten by the last epoch's {accuracy, loss}


def test_output_holds_no_trainer_checkpoints(trained):
    (_, output), _, _ = trained
    names = set(os.listdir(output))
    assert names == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     METRICS_FILE, "rejects", schema.COMPLETE_MARKER, schema.MANIFEST_FILE}


def test_progress_lines_and_epoch_lines_off_a_terminal(trained):
    _, metrics, inputs = trained
    lines = [m for m in inputs["messages"] if m.startswith("[transferset] fine-tuning: ")]
    assert [m.split(": ")[1].split(" steps")[0] for m in lines] == [f"{k} of 30" for k in range(1, 31)]
    assert "ETA" in lines[0] and "/s, " in lines[0]
    epochs = [m for m in inputs["messages"] if m.startswith("epoch ")]
    assert len(epochs) == 5
    first = metrics["history"][0]
    assert epochs[0].startswith(f"epoch 1: train loss {first['train_loss']:.4f}, "
                                f"dev accuracy {first['dev_accuracy']:.4f}")
    assert sum("(best so far)" in m for m in epochs) >= 1


def test_every_setting_reaches_the_trainer(tmp_path):
    cfg = TeacherConfig(epochs=3, lr=2e-5, batch_size=8, warmup=0.25, weight_decay=0.05, seed=7, eval_batch_size=64)
    steps = total_steps(cfg, 100)
    assert steps == 13 * 3  # ceil(100 / 8) per epoch
    args = training_arguments(cfg, str(tmp_path), steps)
    assert (args.num_train_epochs, args.max_steps, args.learning_rate) == (3, 39, 2e-5)
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (8, 64)
    assert (args.warmup_steps, args.weight_decay, args.seed) == (9, 0.05, 7)  # int(0.25 * 39)
    assert args.train_sampling_strategy == "group_by_length"
    assert args.load_best_model_at_end and args.metric_for_best_model == "accuracy" and args.greater_is_better
    assert args.report_to == [] and args.output_dir == str(tmp_path)
    # max_steps cuts the epochs short but never adds any: the Trainer alone would train on to reach it
    assert total_steps(TeacherConfig(epochs=3, batch_size=8, max_steps=5), 100) == 5
    assert total_steps(TeacherConfig(epochs=1, batch_size=8, max_steps=500), 100) == 13
    # warm-up over every step: transformers would read a float 1.0 as one step
    assert training_arguments(TeacherConfig(warmup=1.0), str(tmp_path), 40).warmup_steps == 40
