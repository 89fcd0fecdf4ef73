"""transferset/runtime/timing.py: interleaved rounds, medians and spread, on one thread, with the load the figures
were taken under; the one latency measurement of the run report, training and the benchmarks."""
import pytest

from transferset.runtime import timing
from transferset.runtime.timing import interleaved_latency, measure, ratios


class FakeClock:
    """Time that advances only when a fake model runs (it adds its own cost)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rounds_interleave_models_and_report_median_and_spread():
    clock = FakeClock()
    calls = []
    cost = {"teacher": 2.0, "student": 0.5}

    def model(name):
        def predict(texts):
            calls.append((name, len(texts)))
            clock.now += cost[name] * len(texts) / 1000.0
        return predict

    texts = [f"text {i}" for i in range(300)]
    out = interleaved_latency({n: model(n) for n in cost}, texts, batch_sizes=(1, 64), rounds=5, clock=clock)
    b1, b64 = out["student"]["batch_1"], out["student"]["batch_64"]
    assert b1["median"] == pytest.approx(0.5) and b64["median"] == pytest.approx(0.5)
    assert len(b1["samples"]) == 5 and b1["min"] <= b1["q1"] <= b1["median"] <= b1["q3"] <= b1["max"]
    assert ratios(out, "teacher")["student"] == {"batch_1": pytest.approx(4.0), "batch_64": pytest.approx(4.0)}
    # One untimed call per model and batch size, then per round: 16 calls of 1 text, 2 of 64, for each model.
    assert calls[:4] == [("teacher", 1), ("student", 1), ("teacher", 64), ("student", 64)]
    timed = calls[4:]
    assert len(timed) == 5 * 2 * (16 + 2)
    # The order rotates: round 1 starts with the teacher, round 2 with the student.
    assert timed[0][0] == "teacher" and timed[36][0] == "student"


def test_a_busy_spell_falls_on_every_model_alike():
    """A slow round inflates one sample of each model, not all the samples of one: the medians hold."""
    clock = FakeClock()
    state = {"calls": 0}

    def model(ms):
        def predict(texts):
            state["calls"] += 1
            slow = 5.0 if 40 <= state["calls"] < 80 else 1.0  # a spell spanning parts of rounds
            clock.now += slow * ms * len(texts) / 1000.0
        return predict

    out = interleaved_latency({"a": model(1.0), "b": model(1.0)}, ["x"] * 200, batch_sizes=(1,), rounds=7,
                              clock=clock)
    assert out["a"]["batch_1"]["median"] == pytest.approx(1.0)
    assert out["b"]["batch_1"]["median"] == pytest.approx(1.0)
    assert out["a"]["batch_1"]["max"] > 2 or out["b"]["batch_1"]["max"] > 2  # the spell is in the spread


def test_few_texts_are_repeated_and_no_texts_refused():
    seen = []
    interleaved_latency({"m": lambda t: seen.append(len(t))}, ["only one"], batch_sizes=(64,), rounds=1)
    assert seen == [64, 64, 64]  # warm-up, then two batches of 64
    with pytest.raises(ValueError, match="no texts"):
        interleaved_latency({"m": lambda t: None}, [], rounds=1)


def test_a_timing_records_its_threads_and_load_and_says_when_the_machine_was_busy():
    """A figure carries the threads and load it was taken under and says when the machine was busy (a load
    average above the cores, or the timed thread short of a core): a parallel job can shrink 12-18x speed-ups
    to 1.4-4.3x."""
    import torch

    def run(load, cpu_per_wall):
        clock, cpu = FakeClock(), FakeClock()
        seen = []

        def predict(texts):
            seen.append(torch.get_num_threads())
            clock.now += 0.001 * len(texts)
            cpu.now += cpu_per_wall * 0.001 * len(texts)
        return measure({"m": predict}, ["x"], batch_sizes=(1,), rounds=2, clock=clock, cpu_clock=cpu,
                       load=lambda: list(load), cpu_count=2), seen

    before = torch.get_num_threads()
    quiet, threads_seen = run([0.9, 0.8, 0.7], 1.0)
    assert set(threads_seen) == {1} and torch.get_num_threads() == before  # one thread, then the caller's again
    assert quiet["latency"]["m"]["batch_1"]["median"] == pytest.approx(1.0)
    assert quiet["conditions"] == {"threads": 1, "cpu_count": 2, "load_average_before": [0.9, 0.8, 0.7],
                                   "load_average_after": [0.9, 0.8, 0.7], "cpu_share": 1.0, "busy": False,
                                   "busy_because": None}
    assert "busy" not in timing.describe(quiet["conditions"])
    loaded, _ = run([7.3, 6.0, 5.0], 1.0)  # more runnable threads than cores
    assert loaded["conditions"]["busy"] and "load average 7.30 on 2 CPUs" in loaded["conditions"]["busy_because"]
    starved, _ = run([1.0, 1.0, 1.0], 0.45)  # the load average lags; the thread's share of a core does not
    assert starved["conditions"]["busy"] and starved["conditions"]["busy_because"] == "the timed thread got 45% of a core"
    line = timing.describe(starved["conditions"])
    assert line.startswith("1 thread, load average 1.00 on 2 CPUs, 45% of a core for the timed thread: the machine "
                           "was busy") and "ratios between models are not reliable" in line
    no_load = timing.conditions(threads=1, cpu_count=4, load_before=None, load_after=None, cpu_share=None)
    assert no_load["busy"] is False and timing.describe(no_load) == "1 thread, 4 CPUs"  # an OS without getloadavg
