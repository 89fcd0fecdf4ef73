"""transferset/training/schedules.py: the learning rate at each optimizer step of a recipe's phase.
(students/schedules.py, the students' phases, is tested in tests/students/test_schedules.py.)"""
import pytest
import torch

from linear_task import Linear, _batches, _loss
from transferset.config import EngineConfig
from transferset.training import Engine, PhaseSpec, Recipe


def _lr_expected(schedule: str, step: int, total: int, warmup_steps: int) -> float:
    """The schedules as their papers and Hugging Face write them, independently of transferset.training."""
    import math

    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / (total - warmup_steps)
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_the_learning_rate_at_each_step_follows_the_schedules_formula(schedule, tmp_path):
    import json

    # 2 epochs of 4 batches: T = 8 optimizer steps, warmup 0.25 of them: W = 2; peak lr 0.5.
    engine = Engine.create(EngineConfig(device="cpu", schedule=schedule, warmup=0.25), output=str(tmp_path),
                           log=lambda msg: None, progress_bar=False)
    engine.start_tracking("t", {})
    module = Linear()
    recipe = Recipe(engine)
    recipe.run(0, PhaseSpec("p", epochs=2, keep_best=False, steps_per_epoch=4), module, _loss, _batches,
               lambda: {"accuracy": 0.5}, lambda: torch.optim.SGD(module.parameters(), lr=0.5))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [line["train/lr"] for line in lines if "train/lr" in line]
    assert [line["step"] for line in lines if "train/lr" in line] == list(range(1, 9))
    assert lrs == pytest.approx([0.5 * _lr_expected(schedule, s, 8, 2) for s in range(8)], abs=1e-12)
    assert lrs[0] == 0.0 and lrs[2] == 0.5  # warm-up from 0 to the peak at step W
