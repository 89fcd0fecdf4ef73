"""The teacher's fine-tuning pinned step by step: the per-step losses of a tiny seeded run (metrics.jsonl).

Why pinned and what tolerance: tests/students/test_trainer_trajectories.py (rtol 1e-3). A deliberate change
of the recipe updates the list: run with TRANSFERSET_PIN=1 to print the new one.
"""
import json
import os
import random

import pytest

import builders as testing
from transferset.config import TeacherConfig, TrainerOptimConfig
from transferset.teacher.train import train
from transferset.training.engine import TRACK_FILE

RTOL = 1e-3
WORDS = {"1": ["great", "brilliant", "love"], "0": ["awful", "boring", "hate"]}
FILLER = ["the", "movie", "film", "story", "was", "very", "plot"]

PINNED = [0.695731, 0.694671, 0.688183, 0.760513, 0.681892, 0.678888, 0.687455, 0.707833, 0.651044, 0.670559,
          0.725186, 0.687141, 0.680901, 0.667202, 0.677958, 0.644079, 0.687617, 0.604478, 0.551, 0.46861,
          0.385114, 0.309237, 0.237659, 0.194837, 0.182512, 0.154604, 0.129452, 0.117728, 0.109759, 0.097672]


def _tsv(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("sentence\tlabel\n")
        for _ in range(n):
            label = rng.choice("01")
            words = rng.sample(FILLER, 3) + [rng.choice(WORDS[label])]
            rng.shuffle(words)
            fh.write(f"{' '.join(words)}\t{label}\n")
    return str(path)


def test_the_teacher_fine_tuning_follows_its_pinned_trajectory(tmp_path):
    base = testing.tiny_classifier(str(tmp_path / "base"), label_names=("LABEL_0", "LABEL_1"),
                                  initializer_range=0.02)
    # 96 rows, batch 16: 6 steps an epoch, 5 epochs (the loss leaves ln 2 near step 18).
    cfg = TeacherConfig(model=base, epochs=5, optim=TrainerOptimConfig(lr=1e-2), batch_size=16, max_length=32, seed=0,
                        progress=False, patience=None)  # every epoch: the pinned trajectory is five epochs' steps
    out = str(tmp_path / "teacher")
    train(cfg, train=_tsv(tmp_path / "train.tsv", 96, 0), dev=_tsv(tmp_path / "dev.tsv", 32, 1), output=out,
          log=lambda msg: None)
    with open(os.path.join(out, TRACK_FILE), encoding="utf-8") as fh:
        got = [round(r["train/loss"], 6) for r in map(json.loads, fh) if "train/loss" in r]
    if os.environ.get("TRANSFERSET_PIN"):
        print(f"\nPINNED = {got}")
    assert len(got) == len(PINNED) and got == pytest.approx(PINNED, rel=RTOL)
