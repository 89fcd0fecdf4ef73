"""Learning-rate schedules: a pure function of the optimizer step, and the scheduler that applies it.

The formulas are Hugging Face's (`get_constant_schedule_with_warmup`, `get_linear_schedule_with_warmup`,
`get_cosine_schedule_with_warmup`), so a teacher fine-tuned before the engine section existed gets the same
learning rate at every step: with W = int(warmup · T) warm-up steps of T,

    step s < W:   s / W                                   (every schedule; from 0)
    constant:     1
    linear:       (T - s) / (T - W), not below 0
    cosine:       ½ (1 + cos(π (s - W) / (T - W)))
"""
from __future__ import annotations

import math

import torch

from transferset.config import LR_SCHEDULES


def warmup_steps(warmup: float, total: int) -> int:
    return int(warmup * total)


def lr_factor(schedule: str, step: int, total: int, warmup: float) -> float:
    """The learning rate at optimizer step `step` (from 0) of `total`, as a fraction of the peak."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: expected one of {', '.join(LR_SCHEDULES)}")
    w = warmup_steps(warmup, total)
    if step < w:
        return step / max(1, w)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - w))
    progress = (step - w) / max(1, total - w)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def scheduler(optimizer: torch.optim.Optimizer, schedule: str, total: int,
              warmup: float) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `total` optimizer steps (its state_dict goes into checkpoints)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(schedule, step, total, warmup))
