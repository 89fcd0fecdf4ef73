"""students/latency.py: interleaved rounds, medians and spread; and the run report's speed-up column,
which uses it over the teacher and every student at report time."""
import pytest

from shipped import scored, trained
from students.latency import interleaved_latency, ratios


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


def test_the_report_times_teacher_and_students_together(tmp_path_factory, sst2_dir, sst2_dev200, sst2_dev_texts):
    from transferset.app.report import model_latency

    teacher, scored_dir = scored(tmp_path_factory, sst2_dir)
    student = str(trained(tmp_path_factory, "bilstm", scored_dir, sst2_dev200))
    out = model_latency({"teacher": teacher, "student:bilstm": student}, sst2_dev_texts, rounds=2)
    for name in ("teacher", "student:bilstm"):
        row = out[name]
        assert row["latency_1"] > 0 and row["latency_64"] > 0 and row["parameters"] > 0
        assert row["spread_1"][0] <= row["latency_1"] <= row["spread_1"][1]
    assert out["student:bilstm"]["parameters"] != out["teacher"]["parameters"]
