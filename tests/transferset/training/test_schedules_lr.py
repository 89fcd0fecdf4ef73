"""transferset/training/schedules.py: the learning rate at each optimizer step of a recipe's phase.
(students/phases.py, the students' phases, is tested in tests/students/test_schedules.py.)"""
import pytest
import torch

from linear_task import Linear, _batches, _loss
from transferset.config import EngineConfig
from transferset.training import Engine, PhaseSpec, Recipe, lr_factor
from transferset.training.schedules import scheduler


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


def _hf_formula(schedule: str, step: int, total: int, warmup_steps: int) -> float:
    """Hugging Face's get_*_schedule_with_warmup as written in transformers/optimization.py (max(1, ·) where W = 0
    or W = T), and past T the end value held (1 constant, 0 otherwise)."""
    import math

    if step > total:
        return 1.0 if schedule == "constant" else 0.0
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / max(1, total - warmup_steps))))


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup, total", [(0.0, 10), (0.1, 39), (0.25, 8), (0.06, 1000), (1.0, 5), (0.5, 1)])
def test_the_scheduler_gives_hugging_faces_factor_at_every_step_and_holds_its_end_past_the_total(schedule, warmup,
                                                                                                 total):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.3}], lr=2e-5)
    sched = scheduler(opt, schedule, total, warmup)
    w = int(warmup * total)
    for step in range(total + 4):  # a few steps past the planned total too
        want = _hf_formula(schedule, step, total, w)
        assert abs(opt.param_groups[0]["lr"] - 2e-5 * want) <= 1e-12 * 2e-5, (step, opt.param_groups[0]["lr"])
        assert abs(opt.param_groups[1]["lr"] - 0.3 * want) <= 1e-12, step
        assert abs(lr_factor(schedule, step, total, warmup) - want) <= 1e-12, step
        opt.step()
        sched.step()
    # the checkpoint's scheduler state holds no pickled callable (checkpoints load with weights_only=True)
    assert sched.state_dict()["lr_lambdas"] == [None, None]
    with pytest.raises(ValueError, match="expected one of constant, linear, cosine"):
        lr_factor("step", 0, total, warmup)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_schedule_ended_sooner_reaches_its_planned_end_at_the_new_end(schedule):
    """end_sooner (a phase the budget's deadline will end before its planned steps): the 6 steps planned after step 4
    of 10 run in 2, at the rates of steps 4, 7, then the end value; the steps before keep theirs."""
    from transferset.training.schedules import end_sooner

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched, rates = scheduler(opt, schedule, 10, 0.2), []
    for step in range(7):
        if step == 4:
            assert end_sooner(sched, 6, 10) == 6
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [_lr_expected(schedule, s, 10, 2) for s in (0, 1, 2, 3, 4, 7)]
    assert rates == pytest.approx(expected + [0.0], abs=1e-12)
    # a new end at or past the planned one, or not after now (step 7): the schedule as it was, its end `total`
    before = sched.lr_lambdas[0]
    assert end_sooner(sched, 10, 10) == 10 and end_sooner(sched, 7, 10) == 10 and sched.lr_lambdas[0] is before
