"""The time a run's budget gives the stage in progress: a trainer ends a phase at an epoch's end when another epoch
as long as the last would end past it (transferset/training/recipe.py), keeping its best epoch as early stopping
does. `transferset run --budget-minutes` sets it around each stage (transferset/app/run/runner.py); nothing else
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


def seconds_left() -> Optional[float]:
    """The seconds until the deadline (None: none set; negative once it passed)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()
