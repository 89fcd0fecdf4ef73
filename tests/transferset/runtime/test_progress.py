"""transferset.runtime.progress with an injected clock: a bar on a terminal, a line every 30 s off one.

(It lives beside the teacher's tests, its first user off a terminal; tests/transferset/runtime/test_progress.py
would mirror the package better.)"""
import io

from transferset.runtime import progress
from transferset.runtime.progress import Progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_line_every_30_s_of_fake_time_with_rate_and_eta():
    clock, lines = Clock(), []
    p = Progress("fine-tuning", unit="steps", total=300, clock=clock, log=lines.append)
    for _ in range(50):  # one step every 2 s of fake time: 100 s
        clock.t += 2.0
        p.update(1)
    assert lines == [
        "[transferset] fine-tuning: 15 of 300 steps (5%, 0.5/s, ETA 9m30s)",
        "[transferset] fine-tuning: 30 of 300 steps (10%, 0.5/s, ETA 9m00s)",
        "[transferset] fine-tuning: 45 of 300 steps (15%, 0.5/s, ETA 8m30s)",
    ]
    assert progress.EVERY_S == 30.0


def test_a_resumed_run_counts_the_steps_done_before_but_not_in_its_rate_and_eta():
    """A fine-tuning resumed at step 900 of 1,749 said 0.40/s and ETA 33 min at 0.011 steps/s (20 h)."""
    clock, lines = Clock(), []
    p = Progress("fine-tuning", unit="steps", total=300, clock=clock, log=lines.append)
    p.resumed(150)
    for _ in range(15):  # one step every 2 s of fake time: 30 s
        clock.t += 2.0
        p.update(1)
    assert lines == ["[transferset] fine-tuning: 165 of 300 steps (55%, 0.5/s, ETA 4m30s)"]
    bar = Progress("fine-tuning", unit="steps", total=300, clock=clock, stream=Terminal(), bar=None)
    bar.resumed(150)
    assert bar.n == bar.bar.n == bar.bar.initial == 150


def test_without_total_the_line_has_the_rate_only(capsys):
    clock = Clock()
    p = Progress("rows written", clock=clock)  # to stderr by default
    clock.t += 29.0
    p.update(5_800)
    assert capsys.readouterr().err == ""  # not yet 30 s
    clock.t += 1.0
    p.update(200)
    assert capsys.readouterr().err == "[transferset] rows written: 6,000 rows (200/s)\n"
    assert Progress("x", clock=clock).line() == "[transferset] x: 0 rows (0/s)"


def test_fraction_rate_and_eta_formats():
    clock = Clock()
    p = Progress("rows scored", total=1000, every_s=5.0, clock=clock, log=lambda msg: None)
    clock.t += 10.0
    p.update(250)
    assert p.line() == "[transferset] rows scored: 250 of 1,000 rows (25%, 25/s, ETA 30s)"
    clock.t += 290.0
    p.update(250)
    assert p.line() == "[transferset] rows scored: 500 of 1,000 rows (50%, 1.67/s, ETA 5m00s)"
    clock.t = 100.0 + 0.004  # fast work: thousands separators, no decimals
    assert p.line().endswith("(50%, 125,000/s, ETA 0s)")
    assert progress.format_duration(2 * 3600 + 5 * 60) == "2h05m"


def test_a_bar_only_on_a_terminal_unless_asked():
    clock, lines = Clock(), []
    tty = Terminal()
    p = Progress("fine-tuning", unit="steps", total=10, clock=clock, stream=tty, bar=None, log=lines.append)
    clock.t += 60.0
    p.update(3)
    p.close()
    assert lines == [] and "fine-tuning" in tty.getvalue() and "3/10" in tty.getvalue()
    # Off a terminal, bar=None gives lines; bar=False gives lines even on a terminal.
    for stream, bar in ((io.StringIO(), None), (Terminal(), False)):
        lines.clear()
        p = Progress("fine-tuning", unit="steps", total=10, clock=clock, stream=stream, bar=bar, log=lines.append)
        clock.t += 60.0
        p.update(3)
        p.close()
        assert lines == ["[transferset] fine-tuning: 3 of 10 steps (30%, 0.05/s, ETA 2m20s)"]
        assert stream.getvalue() == ""
