"""The time a run's budget gives the stage in progress: a trainer ends a phase at an epoch's end when another epoch
as long as the last would end past it (transferset/training/recipe.py), keeping its best epoch as early stopping
does, after training on the part of one more that the time left holds when that is at least MIN_PART of it (its
learning-rate schedule ends where end_step says the phase will: transferset/training/schedules.py). `transferset run
--budget-minutes` sets it around each stage (transferset/app/run/runner.py); nothing else
does, so a command without a budget trains every epoch it is given."""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator, Optional

_DEADLINE: contextvars.ContextVar[Optional[float]] = contextvars.ContextVar("transferset_deadline", default=None)


@contextlib.contextmanager
def within(seconds: Optional[float]) -> Iterator[None]:
    """The block has `seconds` from now (None: no limit)."""
    token = _DEADLINE.set(None if seconds is None else time.monotonic() + max(0.0, seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def room_for(seconds: float) -> bool:
    """Whether work taking `seconds` from now ends before the deadline (True when there is none)."""
    deadline = _DEADLINE.get()
    return deadline is None or time.monotonic() + seconds <= deadline


# The least part of an epoch worth training when a whole one would end past the deadline (part_of_epoch), and the
# least part of a trainer's last epoch that a re-fitted plan keeps it for (transferset/app/planning/time_budget.py).
MIN_PART = 0.5


def part_of_epoch(trained: float, evaluated: float) -> float:
    """The part of an epoch whose training took `trained` seconds and its evaluation `evaluated` that ends, evaluated,
    before the deadline: 0 when under MIN_PART (or no deadline is set), else below 1."""
    left = seconds_left()
    return 0.0 if left is None else _part(left, trained, evaluated)


def _part(left: float, trained: float, evaluated: float) -> float:
    """part_of_epoch with `left` seconds to go."""
    if trained <= 0:
        return 0.0
    part = min((left - evaluated) / trained, 0.99)
    return part if part >= MIN_PART else 0.0


def end_step(per_epoch: int, current: int, epochs: int, left: float, epoch_s: float, evaluated: float) -> int:
    """The step at which the deadline ends a phase of `epochs` epochs of `per_epoch` steps when `current` of them are
    trained with `left` seconds to go, each epoch trained in `epoch_s` seconds and evaluated in `evaluated`: after
    the whole epochs more that end before it, then the part of one more (MIN_PART or more), as a trainer decides at
    each epoch's end (room_for, part_of_epoch). Where its learning-rate schedule ends (transferset/training)."""
    more, planned = 0, epochs - current
    while more < planned and (more + 1) * (epoch_s + evaluated) <= left:
        more += 1
    part = _part(left - more * (epoch_s + evaluated), epoch_s, evaluated) if more < planned else 0.0
    return round((current + more + part) * per_epoch)


def seconds_left() -> Optional[float]:
    """The seconds until the deadline (None: none set; negative once it passed)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()
