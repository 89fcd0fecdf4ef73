"""Progress of long work: a bar on a terminal, else a line every 30 s.

Off a terminal (a log file, `nohup`, CI, a Beam worker) a bar prints nothing readable, and a
stage that prints nothing for ten minutes looks dead; a rate-limited line says how far it got,
how fast it goes and when it should end. Beam runs DoFns in several processes, where bars would
overwrite each other: those callers keep the default (lines).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

from tqdm.auto import tqdm

EVERY_S = 30.0  # often enough to show a stage is alive, rare enough to keep a log readable


def log_line(msg: str) -> None:
    """A line on stderr that a running bar (tqdm) stays below: the epoch lines of a training."""
    tqdm.write(msg, file=sys.stderr)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_rate(rate: float) -> str:
    # Three significant digits below 100/s: a teacher's training steps run at 0.1 to 10 per second.
    return f"{rate:,.0f}/s" if rate >= 100 else f"{rate:.3g}/s"


class Progress:
    """`update(k)` after each piece of work; `close()` at the end.

    `bar`: True shows a tqdm bar, None shows one only when `stream` is a terminal, False (the
    default) never does. Without a bar, a line every `every_s` seconds (None: EVERY_S) reports
    the work done and the rate so far; with `total` (e.g. the row count of the input's Parquet
    footers, or a training's optimizer steps) also the fraction done and an ETA. Lines go to
    `log` when given, else to `stream` (stderr).
    """

    def __init__(self, what: str, unit: str = "rows", every_s: Optional[float] = None, stream=None,
                 total: Optional[int] = None, clock: Callable[[], float] = time.monotonic,
                 bar: Optional[bool] = False, log: Optional[Callable[[str], None]] = None):
        self.what, self.unit, self.total, self.clock = what, unit, total, clock
        self.every_s = EVERY_S if every_s is None else every_s
        self.stream = stream or sys.stderr
        self.log = log or (lambda msg: print(msg, file=self.stream, flush=True))
        self.n = self.before = 0  # before: done by an earlier process (a resumed run), left out of the rate
        self.start = self.last = clock()
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = None
        if bar:
            self.bar = tqdm(total=total, desc=what, unit=unit, file=self.stream)

    def line(self, now: Optional[float] = None) -> str:
        now = self.clock() if now is None else now
        rate = (self.n - self.before) / max(now - self.start, 1e-9)
        if not self.total:
            return f"[transferset] {self.what}: {self.n:,} {self.unit} ({format_rate(rate)})"
        left = max(self.total - self.n, 0)
        eta = format_duration(left / rate) if rate > 0 else "?"
        return (f"[transferset] {self.what}: {self.n:,} of {self.total:,} {self.unit} "
                f"({100.0 * self.n / self.total:.0f}%, {format_rate(rate)}, ETA {eta})")

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
            return
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self.log(self.line(now))

    def resumed(self, k: int) -> None:
        """`k` units an earlier process did (a run resumed from its checkpoint): counted as done, left out of
        the rate and so of the ETA (counted in, a 20-hour fine-tuning resumed half-way said ETA 33 minutes)."""
        self.n += k
        self.before += k
        if self.bar is not None:  # tqdm leaves `initial` out of its rate
            self.bar.initial = self.bar.n = self.bar.last_print_n = self.n
            self.bar.refresh()

    def set_postfix(self, **values) -> None:
        """Figures shown next to the bar (e.g. the loss); lines leave them to the caller's own log."""
        if self.bar is not None:
            self.bar.set_postfix(**values)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
