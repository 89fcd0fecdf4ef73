"""The student trainer on the shared recipe (transferset/training/): resume and a non-finite loss.

Fast: the 128-row set scored by the tiny teacher, a 16-unit BiLSTM.
"""
import json

import pytest
import torch

from students import trainer
from students.student import Student
from transferset.app.cli import main
from transferset.config import OptimConfig, StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError

SMALL = dict(threads=1, report={"latency_examples": 16}, vocab={"embed_init": "random"}, model={"embed_dim": 16, "hidden": 16},
             batch_size=16, patience=5)


class Killed(Exception):
    """Stands in for the kill: raised by the loss step after N steps."""


def _kill_after(monkeypatch, steps: int):
    calls = {"n": 0}
    step = trainer.loss_step

    def counting(net, batch, weights):
        calls["n"] += 1
        if calls["n"] > steps:
            raise Killed(f"killed before step {calls['n']}")
        return step(net, batch, weights)

    monkeypatch.setattr(trainer, "loss_step", counting)
    return calls


def _weights(out):
    return Student.from_pretrained(str(out)).model.state_dict()


# the third: a sparse word table, whose lazy Adam state is saved beside AdamW's (training/optimizers.py); the
# fourth: the weights' moving average (optim.ema), saved and resumed with the rest
@pytest.mark.parametrize("schedule, every, sparse, ema", [("joint", 3, False, 0.0),
                                                          ("distill-then-finetune", None, False, 0.0),
                                                          ("joint", 3, True, 0.0), ("joint", 3, False, 0.9)])
def test_a_killed_training_resumes_from_its_checkpoint_to_the_same_model(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                          monkeypatch, schedule, every, sparse, ema):
    small = {**SMALL, "model": {**SMALL["model"], "sparse": sparse}, "optim": OptimConfig(ema=ema)}
    cfg = StudentConfig(**small, epochs=2, phases=schedule, checkpoint_steps=every)
    whole = trainer.train(cfg, tiny_scored_dir, sst2_dev200, str(tmp_path / "whole"), progress=False)
    assert not (tmp_path / "whole" / trainer.CHECKPOINT_DIR).exists()  # removed once the model is written

    # 8 steps an epoch (128 rows / 16): killed in the first epoch's 8th step (a checkpoint after step 6:
    # steps 7 and 8 are trained again), or with per-epoch checkpoints in the second phase's first epoch.
    kill_at = 7 if every else 8 * 2 + 3
    out = tmp_path / "killed"
    _kill_after(monkeypatch, kill_at)
    with pytest.raises(Killed):
        trainer.train(cfg, tiny_scored_dir, sst2_dev200, str(out), progress=False)
    monkeypatch.undo()
    state = torch.load(out / trainer.CHECKPOINT_DIR / "state.pt", weights_only=True)
    assert state["recipe"]["global_step"] == (6 if every else 16)
    assert not (out / schema.STUDENT_MODEL_DIR).exists()

    calls = _kill_after(monkeypatch, 10_000)
    resumed = trainer.train(StudentConfig(**small, epochs=2, phases=schedule, checkpoint_steps=every, resume=True),
                            tiny_scored_dir, sst2_dev200, str(out), progress=False)
    whole_steps = whole["history"][-1]["step"]
    assert calls["n"] == whole_steps - state["recipe"]["global_step"]  # it went on from the checkpoint's step
    assert [h["dev_accuracy"] for h in resumed["history"]] == [h["dev_accuracy"] for h in whole["history"]]
    for r, w in zip(resumed["history"], whole["history"]):
        assert r["losses"] == pytest.approx(w["losses"]) and r["train_loss"] == pytest.approx(w["train_loss"])
    assert [h["rows"] for h in resumed["history"]] == [h["rows"] for h in whole["history"]]
    a, b = _weights(tmp_path / "whole"), _weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same model, bit for bit
    assert not (out / trainer.CHECKPOINT_DIR).exists()
    # metrics.jsonl has every step of the uninterrupted run, those before the checkpoint kept, none twice
    steps = [[json.loads(line)["step"] for line in (d / "metrics.jsonl").read_text().splitlines()]
             for d in (out, tmp_path / "whole")]
    assert steps[0] == steps[1] and steps[0][0] == 1 and steps[0][-1] == whole_steps


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path, tiny_scored_dir, sst2_dev200, monkeypatch):
    out = str(tmp_path / "o")
    _kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        trainer.train(StudentConfig(**SMALL, epochs=2, checkpoint_steps=2), tiny_scored_dir, sst2_dev200, out,
                      progress=False)
    monkeypatch.undo()
    with pytest.raises(UserError, match=r"checkpoint was written with other settings \(settings differ\)"):
        trainer.train(StudentConfig(**{**SMALL, "batch_size": 32}, epochs=2, checkpoint_steps=2, resume=True),
                      tiny_scored_dir, sst2_dev200, out, progress=False)


def test_a_non_finite_loss_stops_the_run_and_saves_nothing(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    import yaml

    cfg = tmp_path / "cfg.yaml"
    # A learning rate this large drives the weights to inf within a few steps: the loss turns NaN.
    cfg.write_text(yaml.safe_dump({**SMALL, "optim": {"lr": 1e30, "grad_clip": 0.0}}))
    rc = main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "o"),
               "--config", str(cfg), "--epochs", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "the training loss is not finite" in err and "phase 'joint', epoch 1, step " in err
    assert "nothing was saved" in err
    assert not (tmp_path / "o" / schema.STUDENT_MODEL_DIR).exists()
    assert not (tmp_path / "o" / schema.METRICS_FILE).exists()


def test_the_weights_average_reaches_the_recipe_and_trains_as_without_it(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                          monkeypatch):
    """optim.ema is the phase's (transferset/training's tests: what is evaluated, kept and ended on); the steps are
    those of a training without it, to the loss."""
    specs, real = [], trainer.PhaseSpec
    monkeypatch.setattr(trainer, "PhaseSpec", lambda *a, **k: specs.append(real(*a, **k)) or specs[-1])
    runs = {ema: trainer.train(StudentConfig(**SMALL, epochs=2, optim=OptimConfig(ema=ema)), tiny_scored_dir,
                               sst2_dev200, str(tmp_path / str(ema)), progress=False) for ema in (0.0, 0.9)}
    assert [spec.ema for spec in specs] == [0.0, 0.9]
    assert [h["train_loss"] for h in runs[0.9]["history"]] == [h["train_loss"] for h in runs[0.0]["history"]]
