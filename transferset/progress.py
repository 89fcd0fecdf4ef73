"""Rate-limited progress lines for long work inside pipeline workers (tqdm needs a terminal
and one process; Beam runs DoFns in several)."""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """`update(k)` after each piece of work; a line every `every_s` seconds.

    With `total` (e.g. the row count of the input's Parquet footers) the line also shows the
    fraction done and an ETA at the rate so far.
    """

    def __init__(self, what: str, unit: str = "rows", every_s: float = 5.0, stream=None,
                 total: Optional[int] = None, clock: Callable[[], float] = time.monotonic):
        self.what, self.unit, self.every_s, self.total, self.clock = what, unit, every_s, total, clock
        self.stream = stream or sys.stderr
        self.n = 0
        self.start = self.last = clock()

    def line(self, now: Optional[float] = None) -> str:
        now = self.clock() if now is None else now
        rate = self.n / max(now - self.start, 1e-9)
        if not self.total:
            return f"[transferset] {self.what}: {self.n:,} {self.unit} ({rate:,.0f}/s)"
        left = max(self.total - self.n, 0)
        eta = format_duration(left / rate) if rate > 0 else "?"
        return (f"[transferset] {self.what}: {self.n:,} of {self.total:,} {self.unit} "
                f"({100.0 * self.n / self.total:.0f}%, {rate:,.0f}/s, ETA {eta})")

    def update(self, k: int = 1) -> None:
        self.n += k
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)
