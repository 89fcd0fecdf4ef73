"""The time a run's budget gives the stage in progress: a trainer ends a phase at an epoch's end when another epoch
as long as the last would end past it (transferset/training/recipe.py), keeping its best epoch as early stopping
does, after training on the part of one more that the time left holds when that is at least MIN_PART of it. `transferset run --budget-minutes` sets it around each stage (transferset/app/run/runner.py); nothing else
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
    if left is None or trained <= 0:
        return 0.0
    part = min((left - evaluated) / trained, 0.99)
    return part if part >= MIN_PART else 0.0


def seconds_left() -> Optional[float]:
    """The seconds until the deadline (None: none set; negative once it passed)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()
