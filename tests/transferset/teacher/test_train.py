import json
import os
import random
from dataclasses import replace

import numpy as np
import pytest

from transferset.app import cli
from transferset.runtime.errors import UserError
import builders as testing
from transferset.config import TeacherConfig, TrainerOptimConfig
from transferset.contract import schema
from transferset.contract.schema import METRICS_FILE
from transferset.models import loading
from transferset.runtime import progress
from transferset.teacher import scoring
from transferset.teacher.train import length_grouped, optimizer, phase_spec, train

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
    cfg = TeacherConfig(model=base, epochs=5, optim=TrainerOptimConfig(lr=1e-2), batch_size=16, max_length=32, seed=0,
                        progress=False, patience=None)
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
    assert metrics["precision"] == "fp32"  # as it ran: the default `auto` on a device without bf16 (conftest)
    with open(os.path.join(output, METRICS_FILE)) as fh:
        assert json.load(fh)["best_dev_accuracy"] == metrics["best_dev_accuracy"]

    # The saved weights are that checkpoint: rescoring dev gives the recorded accuracy.
    teacher = scoring.Teacher.load(output)
    dev = _rows(40, 1)
    pred = teacher.predict([t for t, _ in dev]).labels
    assert np.mean(pred == np.array([int(l) for _, l in dev])) == pytest.approx(metrics["best_dev_accuracy"])


def test_an_epoch_that_does_not_improve_selection_ends_the_fine_tuning(trained, tmp_path):
    (cfg, _), full, files = trained
    # the same fine-tuning with the default patience (1): it ends after the first epoch that is no better
    metrics = train(replace(cfg, patience=TeacherConfig().patience), train=files["train"], dev=files["dev"],
                    output=str(tmp_path / "t"), log=lambda m: None)
    accs = [h["dev_accuracy"] for h in full["history"]]
    stop = next(i for i in range(1, len(accs)) if accs[i] <= max(accs[:i]))  # the first epoch no better
    assert [h["dev_accuracy"] for h in metrics["history"]] == accs[:stop + 1] and stop + 1 < len(accs)
    assert metrics["best_dev_accuracy"] == max(accs[:stop + 1])


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


def test_the_recorded_effective_batch_is_the_one_that_ran(tmp_path, tiny_teacher, capsys):
    """--batch-size 100000 on 12 rows recorded an effective batch of 100,000: one step took the 12 rows."""
    train_tsv = _write_tsv(tmp_path / "train.tsv", _rows(12, 2))
    dev_tsv = _write_tsv(tmp_path / "dev.tsv", _rows(6, 3))
    out = tmp_path / "teacher"
    assert cli.main(["teacher", "--train", train_tsv, "--dev", dev_tsv, "--output", str(out), "--model", tiny_teacher,
                     "--epochs", "1", "--batch-size", "100000"]) == 0
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert metrics["train_rows"] == 12 and metrics["effective_batch_size"] == 12


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
                     METRICS_FILE, "metrics.jsonl", "rejects", schema.COMPLETE_MARKER, schema.MANIFEST_FILE,
                     "README.md"}  # + model card
    steps = [json.loads(line) for line in open(os.path.join(output, "metrics.jsonl"), encoding="utf-8")
             if "train/loss" in line]
    assert [s["step"] for s in steps] == list(range(1, 31))  # every optimizer step logged, as it went


def test_progress_lines_and_epoch_lines_off_a_terminal(trained):
    _, metrics, inputs = trained
    lines = [m for m in inputs["messages"] if m.startswith("[transferset] fine-tuning: ")]
    assert [m.split(": ")[1].split(" steps")[0] for m in lines] == [f"{k} of 30" for k in range(1, 31)]
    assert "ETA" in lines[0] and "/s, " in lines[0]
    epochs = [m for m in inputs["messages"] if m.startswith("fine-tuning epoch ")]  # the students' format too
    assert len(epochs) == 5
    first = metrics["history"][0]
    assert epochs[0].startswith(f"fine-tuning epoch 1: train loss {first['train_loss']:.4f}, "
                                f"dev accuracy {first['dev_accuracy']:.4f}")
    assert sum("(best so far)" in m for m in epochs) >= 1


def test_every_setting_reaches_the_recipe():
    import torch

    from transferset.runtime import typed
    from transferset.training import schedules

    cfg = typed.load(TeacherConfig, {"epochs": 3, "optim": {"lr": 2e-5, "weight_decay": 0.05}, "batch_size": 8,
                                     "engine": {"warmup": 0.25}, "seed": 7, "eval_batch_size": 64}, "test")
    # a partial engine or optim section keeps the rest of the teacher's
    assert (cfg.engine.schedule, cfg.engine.warmup, cfg.optim.grad_clip) == ("linear", 0.25, 1.0)
    spec = phase_spec(cfg, 100)
    steps = spec.optimizer_steps(cfg.engine.grad_accum)
    assert steps == 13 * 3  # ceil(100 / 8) per epoch
    assert (spec.epochs, spec.max_steps, spec.steps_per_epoch, spec.grad_clip) == (3, None, 13, 1.0)
    # early stopping after one epoch without a better selection accuracy, the best kept
    assert spec.keep_best and spec.patience == 1 and not spec.start_competes
    assert phase_spec(replace(cfg, patience=None), 100).patience is None  # every epoch runs
    assert phase_spec(cfg, 100, world=2).steps_per_epoch == 6  # each of 2 ranks: its share of the 13 batches
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = optimizer(cfg, model)
    schedule = schedules.scheduler(opt, cfg.engine.schedule, steps, cfg.engine.warmup)
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [(4, 4)] and decay["weight_decay"] == 0.05
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0  # biases and the LayerNorm weight
    assert opt.defaults["lr"] == 2e-5 and opt.defaults["fused"]
    lrs = []
    for _ in range(steps):
        lrs.append(schedule.get_last_lr()[0])
        opt.step()
        schedule.step()
    assert lrs[0] == 0.0 and lrs[9] == pytest.approx(2e-5) and lrs[-1] < lrs[10]  # int(0.25 * 39) = 9 warm-up steps
    # max_steps cuts the epochs short but never adds any
    assert phase_spec(TeacherConfig(epochs=3, batch_size=8, max_steps=5), 100).optimizer_steps(1) == 5
    assert phase_spec(TeacherConfig(epochs=1, batch_size=8, max_steps=500), 100).optimizer_steps(1) == 13


def test_length_grouped_batches_cover_every_row_once_with_similar_lengths():
    lengths = list(np.random.default_rng(0).integers(1, 100, size=1000))
    batches = length_grouped(lengths, 10, np.random.default_rng(1))
    assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == 100
    spread = np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches])
    assert spread < 10  # random batches of 10 spread over ~80
    assert batches != length_grouped(lengths, 10, np.random.default_rng(2))  # the epoch's stream decides the order


def _dies_on_step(made, step: int):
    """`made` (the module's optimizer factory) whose optimizer raises KeyboardInterrupt before its `step`-th step:
    a kill at a known point of the fine-tuning."""
    def make(*args):
        optimizer = made(*args)
        calls = {"n": 0}

        def counted(opt, args, kwargs):
            calls["n"] += 1
            if calls["n"] == step:
                raise KeyboardInterrupt

        optimizer.register_step_pre_hook(counted)
        return optimizer

    return make


def test_a_killed_fine_tuning_resumes_from_its_checkpoint(tmp_path, tiny_teacher, monkeypatch):
    from transferset.teacher import train as teacher_train

    train_tsv = _write_tsv(tmp_path / "train.tsv", _rows(48, 4))
    dev_tsv = _write_tsv(tmp_path / "dev.tsv", _rows(16, 5))
    cfg = TeacherConfig(model=tiny_teacher, epochs=2, optim=TrainerOptimConfig(lr=1e-3), batch_size=8, max_length=32,
                        seed=1, progress=False)
    whole = train(cfg, train=train_tsv, dev=dev_tsv, output=str(tmp_path / "whole"), log=lambda msg: None)

    out = tmp_path / "killed"
    with monkeypatch.context() as mp:
        # the kill: in the second epoch (6 steps an epoch), after its checkpoint
        mp.setattr(teacher_train, "optimizer", _dies_on_step(teacher_train.optimizer, 9))
        with pytest.raises(KeyboardInterrupt):
            train(cfg, train=train_tsv, dev=dev_tsv, output=str(out), log=lambda msg: None)
    assert (out / "checkpoint" / "state.pt").exists() and not (out / "config.json").exists()
    messages = []
    resumed = train(TeacherConfig(**{**cfg.__dict__, "resume": True}), train=train_tsv, dev=dev_tsv,
                    output=str(out), log=messages.append)
    assert any("resuming from" in m and "epoch 2" in m for m in messages)
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # the same weights, bit for bit
    assert [h["dev_accuracy"] for h in resumed["history"]] == [h["dev_accuracy"] for h in whole["history"]]
    assert not (out / "checkpoint").exists()


def test_a_fine_tuning_killed_mid_epoch_resumes_from_its_step_checkpoint(tmp_path, tiny_teacher, monkeypatch):
    # a large teacher's epoch takes hours on CPU; checkpoint_steps bounds what a kill loses
    from dataclasses import replace

    from transferset.teacher import train as teacher_train
    from transferset.teacher.train import can_resume

    train_tsv = _write_tsv(tmp_path / "train.tsv", _rows(48, 4))
    dev_tsv = _write_tsv(tmp_path / "dev.tsv", _rows(16, 5))
    cfg = TeacherConfig(model=tiny_teacher, epochs=1, optim=TrainerOptimConfig(lr=1e-3), batch_size=8, max_length=32,
                        seed=1, progress=False)
    whole = train(cfg, train=train_tsv, dev=dev_tsv, output=str(tmp_path / "whole"), log=lambda msg: None)
    out = tmp_path / "killed"
    every4 = replace(cfg, checkpoint_steps=4)
    assert not can_resume(every4, train=train_tsv, dev=dev_tsv, output=str(out))
    with monkeypatch.context() as mp:
        # 6 steps in the epoch; the step checkpoint is written after step 4
        mp.setattr(teacher_train, "optimizer", _dies_on_step(teacher_train.optimizer, 5))
        with pytest.raises(KeyboardInterrupt):
            train(every4, train=train_tsv, dev=dev_tsv, output=str(out), log=lambda msg: None)
    assert (out / "checkpoint" / "state.pt").exists() and not (out / "config.json").exists()
    # the checkpoint is this fine-tuning's whatever checkpoint_steps is, and another's when the lr differs
    assert can_resume(cfg, train=train_tsv, dev=dev_tsv, output=str(out))
    assert not can_resume(replace(cfg, optim=TrainerOptimConfig(lr=2e-3)), train=train_tsv, dev=dev_tsv, output=str(out))
    messages = []
    resumed = train(replace(every4, resume=True), train=train_tsv, dev=dev_tsv, output=str(out), log=messages.append)
    assert any("resuming from" in m for m in messages)
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # the same weights, bit for bit
    # metrics.jsonl keeps the steps before the checkpoint (it started at step 5), and step 5 is written once
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [json.loads(line)["step"] for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6, 6]  # six optimizer steps, then the epoch's evaluation at step 6


def test_a_checkpoint_of_the_flat_state_form_resumes_once_migrated(tmp_path, tiny_teacher, monkeypatch):
    """A fine-tuning killed when the recipe's checkpoint was one flat mapping with one random state goes on from
    it once `transferset migrate` converted it (app.migrate.convert_checkpoint), and ends on the uninterrupted
    model."""
    from dataclasses import replace

    import torch

    from transferset.teacher import train as teacher_train

    train_tsv = _write_tsv(tmp_path / "train.tsv", _rows(48, 4))
    dev_tsv = _write_tsv(tmp_path / "dev.tsv", _rows(16, 5))
    cfg = TeacherConfig(model=tiny_teacher, epochs=1, optim=TrainerOptimConfig(lr=1e-3), batch_size=8, max_length=32,
                        seed=1, progress=False, checkpoint_steps=4)
    whole = train(cfg, train=train_tsv, dev=dev_tsv, output=str(tmp_path / "whole"), log=lambda msg: None)
    out = tmp_path / "killed"
    with monkeypatch.context() as mp:
        mp.setattr(teacher_train, "optimizer", _dies_on_step(teacher_train.optimizer, 5))
        with pytest.raises(KeyboardInterrupt):
            train(cfg, train=train_tsv, dev=dev_tsv, output=str(out), log=lambda msg: None)
    path = out / "checkpoint" / "state.pt"
    new = torch.load(path, map_location="cpu", weights_only=True)
    assert new["recipe"]["global_step"] == 4
    # the flat form the recipe wrote before its state became dataclasses
    flat = {"fingerprint": new["fingerprint"], "phase": new["phase"]["index"], "global_step": new["recipe"]["global_step"],
            "history": new["recipe"]["history"], "phase_log": new["recipe"]["phase_log"], "model": new["model"],
            "optimizer": new["optimizer"], "scheduler": new["scheduler"], "rng": new["rng"][0],
            **{k: new["phase"][k] for k in ("epoch", "batches", "phase_step", "best_acc", "best_state", "bad",
                                            "start_acc", "partial")}}
    torch.save(flat, path)
    from transferset.app.migrate import convert_checkpoint

    assert convert_checkpoint(str(out / "checkpoint"), teacher=True)
    resumed = train(replace(cfg, resume=True), train=train_tsv, dev=dev_tsv, output=str(out), log=lambda msg: None)
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # the same weights, bit for bit
