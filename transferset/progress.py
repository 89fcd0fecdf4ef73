"""Rate-limited progress lines for long work inside pipeline workers (tqdm needs a terminal
and one process; Beam runs DoFns in several)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, what: str, unit: str = "rows", every_s: float = 5.0, stream=None):
        self.what, self.unit, self.every_s = what, unit, every_s
        self.stream = stream or sys.stderr
        self.n = 0
        self.start = self.last = time.monotonic()

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            rate = self.n / max(now - self.start, 1e-9)
            print(f"[transferset] {self.what}: {self.n:,} {self.unit} ({rate:,.0f}/s)", file=self.stream, flush=True)
