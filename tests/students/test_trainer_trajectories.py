"""Pinned training trajectories: the per-step losses of tiny seeded runs of a BiLSTM and a transformer student.

A test that a resumed run equals the whole run passes when a change alters both the same way; these pin the
numbers themselves (as torchtune pins its recipes' losses), so a change to a loss, the data order, the
initialisation, the schedule or the optimizer shows here as a changed trajectory. A deliberate change updates
the pinned lists: run with TRANSFERSET_PIN=1 to print the new ones.

Tolerance: the runs are float32 on one thread with fixed seeds and give the same numbers run after run here.
On another CPU the kernels' blocking changes the summation order: logits through differently composed batches
were seen to move by 1.2e-5 absolute, and such a drift compounds over the 16 steps pinned. rtol 1e-3 leaves room
for that and still catches a real change: a learning rate 10 % higher moves 14 of the transformer's 16 losses
outside it (by up to 3 %).
"""
import json
import os

import pytest

from students import trainer
from transferset.config import OptimConfig, StudentConfig, StudentEngineConfig
from transferset.training.engine import TRACK_FILE

RTOL = 1e-3
SMALL = dict(threads=1, report={"latency_examples": 16}, batch_size=16, patience=5, seed=0)


def _losses(out: str) -> list[float]:
    with open(os.path.join(out, TRACK_FILE), encoding="utf-8") as fh:
        return [round(r["train/loss"], 6) for r in map(json.loads, fh) if "train/loss" in r]


def _check(name: str, got: list[float], pinned: list[float]) -> None:
    if os.environ.get("TRANSFERSET_PIN"):
        print(f"\nPINNED[{name!r}] = {got}")
    assert len(got) == len(pinned), f"{name}: {len(got)} steps, pinned {len(pinned)}"
    assert got == pytest.approx(pinned, rel=RTOL), name


PINNED = {
    "bilstm": [0.419975, 0.428355, 0.390604, 0.388881, 0.393101, 0.378989, 0.392382, 0.402548, 0.380569, 0.402276,
               0.397095, 0.379105, 0.412549, 0.396084, 0.367051, 0.385902],
    "transformer": [1.13997, 1.08178, 0.741824, 0.76803, 0.811802, 0.41662, 0.963545, 0.724647, 1.149799, 0.626684,
                    1.050328, 0.984703, 0.406808, 0.85628, 0.52528, 0.644107],
}


def test_a_bilstm_student_follows_its_pinned_trajectory(tmp_path, tiny_scored_dir, sst2_dev200):
    # 128 rows, batch 16: 8 steps an epoch, 2 epochs; KL and gold CE on a 16-unit BiLSTM from random vectors.
    cfg = StudentConfig(**SMALL, epochs=2, vocab={"embed_init": "random"}, model={"embed_dim": 16, "hidden": 16},
                        losses={"kd": 1.0, "ce": 0.5})
    out = str(tmp_path / "bilstm")
    trainer.train(cfg, tiny_scored_dir, sst2_dev200, out, progress=False)
    _check("bilstm", _losses(out), PINNED["bilstm"])


def test_a_transformer_student_cut_from_the_teacher_follows_its_pinned_trajectory(tmp_path, tiny_scored_dir,
                                                                                   sst2_dev200):
    # Two of the tiny teacher's four layers (skip init), KL on the cached logits only: no online teacher; with a
    # linear warm-up and decay (the family's own engine is a constant rate), so the schedule is in the numbers.
    cfg = StudentConfig(**SMALL, student="transformer", epochs=2, model={"n_layer": 2}, losses={"kd": 1.0},
                        optim=OptimConfig(lr=1e-3), engine=StudentEngineConfig(schedule="linear", warmup=0.1))
    out = str(tmp_path / "transformer")
    trainer.train(cfg, tiny_scored_dir, sst2_dev200, out, progress=False)
    _check("transformer", _losses(out), PINNED["transformer"])


def test_a_killed_and_resumed_bilstm_follows_the_same_pinned_trajectory(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                         monkeypatch):
    """Killed after step 6 (a checkpoint every 3 steps), resumed: metrics.jsonl holds the pinned losses, each step
    once, the steps before the checkpoint kept and those after it trained again."""
    from test_trainer_recipe import Killed, _kill_after

    values = dict(SMALL, epochs=2, vocab={"embed_init": "random"}, model={"embed_dim": 16, "hidden": 16}, losses={"kd": 1.0, "ce": 0.5}, checkpoint_steps=3)
    out = str(tmp_path / "bilstm")
    _kill_after(monkeypatch, 7)
    with pytest.raises(Killed):
        trainer.train(StudentConfig(**values), tiny_scored_dir, sst2_dev200, out, progress=False)
    monkeypatch.undo()
    trainer.train(StudentConfig(**values, resume=True), tiny_scored_dir, sst2_dev200, out, progress=False)
    _check("bilstm resumed", _losses(out), PINNED["bilstm"])
