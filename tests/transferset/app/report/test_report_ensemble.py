"""transferset/app/report/__init__.py with a teacher ensemble: its row sums its members', each member has its own row."""
import pytest

from transferset.app.report import ensemble_latency, member_rows, results_table

MEMBERS = [{"parameters": 100, "latency_1": 10.0, "latency_64": 1.0, "spread_1": [9.0, 11.0], "spread_64": [0.9, 1.1]},
           {"parameters": 100, "latency_1": 20.0, "latency_64": 3.0, "spread_1": [19.0, 21.0], "spread_64": [2.9, 3.1]}]


def test_the_ensemble_costs_the_sum_of_its_members():
    assert ensemble_latency(MEMBERS) == {"parameters": 200, "latency_1": 30.0, "latency_64": 4.0,
                                         "spread_1": [28.0, 32.0], "spread_64": [pytest.approx(3.8), pytest.approx(4.2)]}


def test_member_rows_carry_their_accuracy_and_speed_against_the_ensemble():
    lat = {"teacher 0": MEMBERS[0], "teacher 1": MEMBERS[1], "teacher": ensemble_latency(MEMBERS)}
    tested = {"accuracy": 0.9, "members": [{"model": "/r/teachers/seed0", "accuracy": 0.88},
                                           {"model": "/r/teachers/seed1", "accuracy": 0.86}]}
    rows = member_rows(["/r/teachers/seed0", "/r/teachers/seed1/"], lat, [0.8, 0.7], tested, busy=False)
    assert [(r["display"], r["dev_accuracy"], r["test_accuracy"]) for r in rows] == [
        ("teacher member 0: seed0", 0.8, 0.88), ("teacher member 1: seed1", 0.7, 0.86)]
    assert (rows[0]["speedup_1"], rows[1]["speedup_64"]) == (3.0, pytest.approx(4 / 3))
    ensemble_row = {"name": "teacher", "display": "teacher: ensemble of 2 (mean)", "dev_accuracy": 0.85,
                    "test_accuracy": 0.9, "agreement": None, **lat["teacher"]}
    table = results_table([ensemble_row, *rows])
    assert "| teacher: ensemble of 2 (mean) | 85.0 | 90.0 | - | 200 | 30.00 | 4.000 | 1.0× / 1.0× |" in table
    assert "| teacher member 0: seed0 | 80.0 | 88.0 | - | 100 | 10.00 | 1.000 | 3.0× / 4.0× |" in table
    # no test split: no test accuracy; a busy machine: no speed-up
    busy = member_rows(["/a", "/b"], lat, [0.8, 0.7], None, busy=True)
    assert busy[0]["test_accuracy"] is None and busy[0]["speedup_1"] is None


def test_the_latency_benchmark_times_an_ensemble_runs_first_member_as_the_teacher(tmp_path):
    import importlib.util
    from pathlib import Path

    from transferset.contract import schema

    path = Path(__file__).resolve().parents[4] / "benchmarks" / "latency.py"
    spec = importlib.util.spec_from_file_location("latency_benchmark", path)
    latency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(latency)
    for seed in (1, 0):
        (tmp_path / "teachers" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "teachers" / f"seed{seed}" / schema.HF_CONFIG_FILE).write_text("{}")
    assert latency.models_of(str(tmp_path)) == {"teacher": str(tmp_path / "teachers" / "seed0")}
    with pytest.raises(SystemExit, match="no teacher/"):
        latency.models_of(str(tmp_path / "teachers" / "seed0"))
