"""The test stage: every model scored once on the held-out split, after every stage that made one."""
import json

from transferset.app.stages.heldout import TEST_RESULTS_FILE, evaluate_on_test
from transferset.config import AugmentConfig
from stage_plans import plan_of  # noqa: F401 (a fixture)


def test_it_waits_for_every_model_and_names_them(plan_of):
    plan = plan_of()
    test = plan.stages[-1]
    assert (test.name, test.upstream) == ("test", ("teacher", "students.labels_only", "students.distilled",
                                                   "compress.ship.teacher", "compress.ship.labels_only",
                                                   "compress.ship.distilled"))
    assert test.settings["models"] == ["teacher", "labels_only", "distilled", "teacher (ONNX)", "labels_only (ONNX)",
                                       "distilled (ONNX)"]
    assert plan.outputs.test_results.endswith("/r/test/accuracy.json")


def test_no_test_split_no_stage(plan_of):
    plan = plan_of("validation=null", "labeled_limit=50", "unlabeled_rows=null")
    assert [s.name for s in plan.stages if s.name == "test"] == [] and plan.outputs.test_results is None


def test_evaluate_on_test_writes_each_models_result(tmp_path):
    calls = []

    def fake_evaluate(path, test, **kw):
        calls.append((path, kw.get("speed")))
        return {"accuracy": 0.5 if path == "a" else 0.75}

    doc = evaluate_on_test("t.tsv", {"a": "a", "b": "b"}, str(tmp_path), AugmentConfig(), fake_evaluate,
                           speeds={"b": 0.2})
    assert calls == [("a", None), ("b", 0.2)]
    assert json.loads((tmp_path / TEST_RESULTS_FILE).read_text()) == doc == \
        {"test": "t.tsv", "models": {"a": {"accuracy": 0.5}, "b": {"accuracy": 0.75}}}
