"""Learning-rate schedules: Hugging Face's (`transformers.get_scheduler`), so a teacher fine-tuned before the
engine section existed gets the same learning rate at every step. With W = int(warmup · T) warm-up steps of T:

    step s < W:   s / W                                   (every schedule; from 0)
    constant:     1                                       (HF's constant_with_warmup)
    linear:       (T - s) / (T - W), not below 0
    cosine:       ½ (1 + cos(π (s - W) / (T - W)))

Kept of ours: past T (a phase that runs longer than planned) the factor holds its end value, 1 or 0, where
Hugging Face's cosine would rise again; a phase the budget's deadline will end sooner (transferset.runtime.deadline
.end_step, projected a tenth into its first epoch and at each epoch's end: recipe.py) has the rest of its schedule
compressed into the steps it has left (`end_sooner`).
"""
from __future__ import annotations

import torch

from transferset.config import LR_SCHEDULES

# our names → transformers.SchedulerType's
_HF_NAMES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def warmup_steps(warmup: float, total: int) -> int:
    return int(warmup * total)


def scheduler(optimizer: torch.optim.Optimizer, schedule: str, total: int,
              warmup: float) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `total` optimizer steps (its state_dict goes into checkpoints)."""
    from transformers import get_scheduler  # heavy: only when a phase has a schedule

    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: expected one of {', '.join(LR_SCHEDULES)}")
    sched = get_scheduler(_HF_NAMES[schedule], optimizer, num_warmup_steps=warmup_steps(warmup, total),
                          num_training_steps=total)
    hf_factor, end = sched.lr_lambdas[0], 1.0 if schedule == "constant" else 0.0

    def factor(step: int) -> float:
        # a plain function, so that the checkpoint's scheduler state stays free of pickled callables
        return hf_factor(step) if step <= total else end

    sched.lr_lambdas = [factor] * len(sched.lr_lambdas)
    return sched


def end_sooner(sched: torch.optim.lr_scheduler.LambdaLR, end: int, total: int) -> int:
    """The schedule's steps from now (its last_epoch) to `total` compressed to end at step `end`: a phase that ends
    sooner than planned decays its rate as far as it would have by `total` (a linear one to 0, not stopping part-way
    down); → the schedule's end now (`total` where `end` is not between now and it)."""
    now = sched.last_epoch
    if end >= total or end <= now:
        return total
    planned, scale = sched.lr_lambdas[0], (total - now) / (end - now)

    def factor(step: int) -> float:
        return planned(step if step <= now else min(total, now + (step - now) * scale))

    sched.lr_lambdas = [factor] * len(sched.lr_lambdas)
    return end


def lr_factor(schedule: str, step: int, total: int, warmup: float) -> float:
    """The learning rate at optimizer step `step` (from 0) of `total`, as a fraction of the peak."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return float(scheduler(probe, schedule, total, warmup).lr_lambdas[0](step))
