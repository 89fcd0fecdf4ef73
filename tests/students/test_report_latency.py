"""The run report's latency (transferset/app/report/__init__.py, over transferset/runtime/timing.py) with a real teacher and a
trained student: every model timed together, on one thread, with the load it ran under."""
from shipped import scored, trained
from transferset.app.report.latency import model_latency


def test_the_report_times_teacher_and_students_together_on_one_thread(tmp_path_factory, sst2_dir, sst2_dev200,
                                                                       sst2_dev_texts):
    teacher, scored_dir = scored(tmp_path_factory, sst2_dir)
    student = str(trained(tmp_path_factory, "bilstm", scored_dir, sst2_dev200))
    timed = model_latency({"teacher": teacher, "student:bilstm": student}, sst2_dev_texts, rounds=2)
    out = timed["models"]
    for name in ("teacher", "student:bilstm"):
        row = out[name]
        assert row["latency_1"] > 0 and row["latency_64"] > 0 and row["parameters"] > 0
        assert row["spread_1"][0] <= row["latency_1"] <= row["spread_1"][1]
    assert out["student:bilstm"]["parameters"] != out["teacher"]["parameters"]
    cond = timed["conditions"]
    assert cond["threads"] == 1 and cond["cpu_count"] >= 1 and 0 < cond["cpu_share"]
    assert isinstance(cond["busy"], bool) and len(cond["load_average_after"]) == 3

