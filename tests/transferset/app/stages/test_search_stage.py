"""The search stage: candidates timed untrained, those over budget dropped before any training, successive halving
on the selection split, every candidate a student folder reused by key; the refusals before any training."""
import json

import pytest

from transferset.app.planning.calibrate import measure_rates
from transferset.app.run.runner import resolve_data, run_pipeline
from transferset.app.stages.context import StageFunctions, make_run
from transferset.app.stages.search_timing import before_scoring
from transferset.app.report.search import budget_line, frontier_points, search_plot
from transferset.app.stages.search import candidate_configs, chosen_by, closest, over_budget, rank, rung_sizes, ship
from transferset.data.card import _chosen_by
from transferset.config.search import DEFAULT_SPACE, SearchConfig
from transferset.runtime.errors import UserError
from stage_plans import plan_of, search_config, search_data  # noqa: F401 (a fixture)


@pytest.mark.parametrize("n, rungs, keep, sizes", [(6, (1, 4), 0.5, [6, 3]), (5, (1, 2, 4), 0.5, [5, 3, 2]),
                                                   (1, (1, 4), 0.5, [1, 1]), (9, (1, 2, 3), 0.34, [9, 4, 2]),
                                                   (4, (2,), 0.5, [4])])
def test_rung_sizes_keep_the_best_fraction_rounded_up_and_never_none(n, rungs, keep, sizes):
    assert rung_sizes(n, rungs, keep) == sizes


def test_a_rung_ranks_by_selection_accuracy_then_the_faster_variant_then_the_space_order():
    # the demo's 1 ms search, seed 2: the float32 BiLSTM and its int8 export selected alike (82.7); ship the int8
    record = {"bilstm-150": {"latency_1": 0.68, "selection_accuracy": {"4 epochs": 0.827}},
              "bilstm-150+int8": {"latency_1": 0.42, "selection_accuracy": {"4 epochs": 0.827}},
              "bilstm-300+int8": {"latency_1": 0.87, "selection_accuracy": {"4 epochs": 0.823}},
              "tiny+exits@0.5": {"latency_1": 0.1, "selection_accuracy": {"4 epochs": 0.823},
                                 "trained": {"4 epochs": {"latency_1": 0.9}}},  # as trained, not its bound
              "static": {"latency_1": 0.42, "selection_accuracy": {"4 epochs": 0.7}},
              "static+int8": {"latency_1": 0.42, "selection_accuracy": {"4 epochs": 0.7}}}
    order = list(record)
    assert rank(list(reversed(order)), record, "4 epochs", order) == [
        "bilstm-150+int8", "bilstm-150", "bilstm-300+int8", "tiny+exits@0.5", "static", "static+int8"]


def test_over_budget_says_each_bound_a_candidate_misses_and_closest_is_the_nearest():
    sc = SearchConfig(budget_ms=1.0, budget_mb=10.0)
    fast_big = {"latency_1": 0.5, "mb": 40.0, "teacher_ms": None}
    slow_small = {"latency_1": 3.0, "mb": 2.0, "teacher_ms": None}
    assert over_budget(fast_big, sc, None) == ["40 MB > 10 MB"]
    assert over_budget(slow_small, sc, None) == ["3 ms > 1 ms"]
    assert over_budget({"latency_1": 1.0, "mb": 10.0}, sc, None) == []  # on the bound is within it
    assert closest({"a": fast_big, "b": slow_small}, sc) == "b"  # 3x over against 4x over
    speed = SearchConfig(budget_speedup=50)
    assert over_budget({"latency_1": 0.5, "mb": 1.0}, speed, 12.0) == ["24x the teacher's speed < 50x"]


def test_the_chosen_students_card_says_what_it_was_chosen_against():
    doc = {"budget": {"budget_ms": 1.0, "budget_mb": None, "budget_speedup": None}, "runtime": "onnx", "rungs": [1, 4],
           "chosen": "b", "candidates": {
               "a": {"latency_1": 0.4, "over_budget": [], "selection_accuracy": {"1 epochs": 0.8, "4 epochs": 0.81}},
               "b": {"latency_1": 0.7, "over_budget": [], "selection_accuracy": {"1 epochs": 0.79, "4 epochs": 0.83}},
               "c": {"latency_1": 0.5, "over_budget": [], "selection_accuracy": {"1 epochs": 0.7}},
               "d": {"latency_1": 3.0, "over_budget": ["3 ms > 1 ms"]}}}
    record = chosen_by(doc)
    assert record == {"budget": doc["budget"], "runtime": "onnx", "rungs": [1, 4], "candidates": 4, "within_budget": 3,
                      "latency_1": 0.7, "selection_accuracy": 0.83, "runner_up": {"name": "a", "accuracy": 0.81}}
    assert _chosen_by(record) == (
        "- chosen by a search: budget 1 ms per example, timed at batch 1 on one CPU thread (its ONNX export on ONNX "
        "Runtime, untrained: 0.7 ms); the most accurate on the selection split (83.0%) of the 3 candidates within "
        "the budget (of 4), by successive halving over 1, 4 epochs; the runner-up, a, reached 81.0%")
    alone = chosen_by({**doc, "candidates": {"b": doc["candidates"]["b"]}})
    assert alone["runner_up"] is None and "runner-up" not in _chosen_by(alone)


def test_the_searched_frontier_plots_each_trained_variant_at_its_last_rung_and_the_tighter_budget_line(tmp_path):
    doc = {"budget": {"budget_ms": 2.0, "budget_mb": None, "budget_speedup": 10.0}, "chosen": "b", "candidates": {
        "a": {"latency_1": 0.4, "teacher_ms": 15.0, "selection_accuracy": {"1 epochs": 0.8, "4 epochs": 0.81}},
        "b+exits@0.5": {"latency_1": 0.9, "teacher_ms": 15.0, "selection_accuracy": {"1 epochs": 0.79},
                        "trained": {"1 epochs": {"latency_1": 1.3}}},
        "b": {"latency_1": 1.1, "teacher_ms": 15.0, "selection_accuracy": {"1 epochs": 0.82, "4 epochs": 0.85}},
        "c+int8": {"latency_1": 0.3, "teacher_ms": 15.0, "selection_accuracy": {"1 epochs": None}},
        "d": {"latency_1": 3.0, "teacher_ms": 15.0, "over_budget": ["3 ms > 2 ms"]}}}
    assert frontier_points(doc) == [("a", 0.4, 81.0), ("b+exits@0.5", 1.3, 79.0), ("b", 1.1, 85.0)]
    assert budget_line(doc) == 1.5  # 15 ms / 10x is tighter than 2 ms
    assert budget_line({**doc, "budget": {"budget_mb": 3.0}}) is None
    from transferset.app.report import _plt

    assert search_plot(doc, str(tmp_path), _plt()) == str(tmp_path / "search.png")
    assert search_plot({**doc, "candidates": {"d": doc["candidates"]["d"]}}, str(tmp_path), _plt()) is None


def test_the_default_space_covers_the_families_and_the_search_sits_before_the_test(plan_of):
    assert {s["student"] for s in SearchConfig(budget_ms=1).candidates().values()} == {"bilstm", "static",
                                                                                       "transformer"}
    assert set(SearchConfig(budget_ms=1).candidates()) == set(DEFAULT_SPACE)
    plan = plan_of("search.budget_ms=1")
    names = [s.name for s in plan.stages]
    assert names[-2:] == ["search", "test"] and "search" in plan.stages[-1].upstream
    # a budget's deadline would cut the later candidates short of the earlier ones' epochs: the search has none
    assert [s.name for s in plan.stages if not s.budgeted] == ["search"]
    assert plan.outputs.students["search"].endswith("/r/search/chosen")
    with pytest.raises(ValueError, match="students.search: the search's chosen student has that name"):
        plan_of("search.budget_ms=1", "students.search={student: static}")
    with pytest.raises(ValueError, match="search: run_dir memory://runs/r is a URL"):
        plan_of("search.budget_ms=1", "run_dir=memory://runs/r")


class Killed(Exception):
    pass


@pytest.mark.integration
def test_a_tiny_search_chooses_in_budget_resumes_when_killed_and_a_second_budget_reuses(tmp_path, sst2_dir,
                                                                                      head_tsv, tiny_teacher):
    data = search_data(tmp_path, sst2_dir, head_tsv)
    trained = []

    def student(cfg, scored, dev, out, **kw):
        trained.append((cfg.model.get("hidden"), cfg.student, cfg.epochs))
        if len(trained) == 3:  # killed while the search trains its second candidate
            raise Killed
        return StageFunctions.student(cfg, scored, dev, out, **kw)

    with pytest.raises(Killed):
        run_pipeline(search_config(tmp_path, data, tiny_teacher, 2.0), log=lambda m: None,
                     functions=StageFunctions(student=student))
    log = []
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 2.0), log=log.append, functions=StageFunctions(student=student))
    doc = json.loads((tmp_path / "run" / "search" / "search.json").read_text())
    c = doc["candidates"]
    # huge (a 512-unit BiLSTM) is over 2 MB: dropped before any training, never trained
    assert c["huge"]["stopped"].startswith("over budget: ") and "MB > 2 MB" in c["huge"]["stopped"]
    assert "selection_accuracy" not in c["huge"] and all(h != 512 for h, _, _ in trained)
    # rung 1: the three in budget, 1 epoch; rung 2: the best two (ceil 1.5), 2 epochs; the best of those chosen
    assert all(list(c[n]["selection_accuracy"]) [:1] == ["1 epochs"] for n in ("small", "wide", "static"))
    second = [n for n in ("small", "wide", "static") if "2 epochs" in c[n]["selection_accuracy"]]
    assert len(second) == 2 and doc["chosen"] in second and c[doc["chosen"]]["stopped"].startswith("chosen")
    assert c[doc["chosen"]]["selection_accuracy"]["2 epochs"] == max(c[n]["selection_accuracy"]["2 epochs"]
                                                                     for n in second)
    (dropped,) = {"small", "wide", "static"} - set(second)
    assert c[dropped]["stopped"] == "rung 1 (1 epochs): not among the best 2 of 3"
    # the killed run's finished candidate was reused, not trained again
    assert any(m.startswith("[search.small.e1] up to date") for m in log)
    # the chosen student is tested and reported with the run's other models
    tested = json.loads((tmp_path / "run" / "test" / "accuracy.json").read_text())["models"]
    # (and the teacher and plain as they ship; the search's choice is shipped as it was timed already)
    assert set(tested) == {"teacher", "plain", "search", "teacher (ONNX)", "plain (ONNX)"}
    assert 0 <= tested["search"]["accuracy"] <= 1
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["search"]["chosen"] == doc["chosen"]
    assert any(r["name"].startswith("student: search (") for r in results["rows"])
    # another budget: every candidate it keeps is reused by key, none trained again; its plan times the candidates
    # (the search's inputs are there) and counts those in budget, and the search takes that timing, not its own
    before = len(trained)
    log.clear()
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 1.5), log=log.append, functions=StageFunctions(student=student),
                 measure=measure_rates)
    assert len(trained) == before and any(m.startswith("[search] running") for m in log)
    c = json.loads((tmp_path / "run" / "search" / "search.json").read_text())["candidates"]
    within = [n for n in c if c[n]["over_budget"] == []]
    row = next(m for m in log if m.startswith("  search "))
    assert f" {len(within)} of 4 variants in budget (timed untrained), {len(within)} candidate" in row
    assert [m.startswith("[search] timing ") for m in log].count(True) == 1
    assert log.index(row) < log.index("[search] the plan's timing of 4 untrained variants, reused")
    results_md = (tmp_path / "run" / "results.md").read_text()
    assert "Search: budget 1.5 MB, each candidate's ONNX export timed on ONNX Runtime; chosen: " in results_md
    assert "| huge |" in results_md
    assert "<h2>Search</h2>" in (tmp_path / "run" / "report.html").read_text()
    # the searched frontier: a plot in the report, named in results.json where it ends up
    assert 'alt="searched students"' in (tmp_path / "run" / "report.html").read_text()
    plot = json.loads((tmp_path / "run" / "results.json").read_text())["search"]["plot"]
    assert plot == str(tmp_path / "run" / "report_files" / "search.png") and (tmp_path / "run" / "report_files" /
                                                                             "search.png").stat().st_size > 1000
    # shipped as what met the budget, its ONNX export (float32): the report times it on ONNX Runtime
    chosen = tmp_path / "run" / "search" / "chosen"
    assert (chosen / "model.onnx").exists() and not (chosen / "model").exists()
    assert json.loads((chosen / "config.json").read_text())["transferset_export"].get("quantize") is None
    row = next(r for r in results["rows"] if r["name"].startswith("student: search ("))
    assert row["runtime"] == "ONNX Runtime"
    assert json.loads((chosen / "metrics.json").read_text())["dev_accuracy"] == c[doc["chosen"]][
        "selection_accuracy"]["2 epochs"]
    assert tested["search"]["accuracy"] == pytest.approx(evaluate_ok(chosen, data / "dev.tsv"))
    # the chosen student's card says the budget it was chosen under and what against
    card = (chosen / "README.md").read_text()
    assert "An ONNX export (float32)" in card
    assert "- test split: " in card and "- test split: not measured" not in card
    assert "- chosen by a search: budget 1.5 MB, timed at batch 1 on one CPU thread (its ONNX export" in card
    assert "candidates within the budget (of 4), by successive halving over 1, 2 epochs" in card
    # the candidates built before the scoring (a fresh run's plan: the teacher, the set's record, no set) have the
    # sizes and parameters they have on the scored set
    run = make_run(search_config(tmp_path, data, tiny_teacher, 1.5), resolve_data(str(data)), StageFunctions())
    early, _ = before_scoring(run, candidate_configs(run.cfg.search), ["a fine film", "a dull one"])
    assert {n: (e["mb"], e["parameters"]) for n, e in early.items()} == {
        n: (e["mb"], e["parameters"]) for n, e in c.items()}
    # a budget no candidate meets is refused, naming the closest, before any training
    with pytest.raises(UserError, match=r"search: no candidate meets the budget; the closest is (small|static)"):
        run_pipeline(search_config(tmp_path, data, tiny_teacher, 1e-4), log=lambda m: None,
                     functions=StageFunctions(student=student))
    assert len(trained) == before


@pytest.mark.integration
def test_an_int8_variant_is_timed_as_its_export_trained_as_its_candidate_and_shipped_as_the_export(
        tmp_path, sst2_dir, head_tsv, tiny_teacher):
    data = search_data(tmp_path, sst2_dir, head_tsv)
    trained, evaluated = [], []

    def student(cfg, scored, dev, out, **kw):
        trained.append((cfg.model.get("hidden"), cfg.epochs))
        return StageFunctions.student(cfg, scored, dev, out, **kw)

    def evaluate(model, data_file, **kw):
        evaluated.append(model)
        return StageFunctions.evaluate(model, data_file, **kw)

    space = {"small": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}},
             "huge": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 512}}}
    # the 512-unit BiLSTM is ~8.5 MB in float32 and ~2.2 MB in int8: only its int8 variant meets 4 MB
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 4.0, int8=True, space=space), log=lambda m: None,
                 functions=StageFunctions(student=student, evaluate=evaluate))
    doc = json.loads((tmp_path / "run" / "search" / "search.json").read_text())
    c = doc["candidates"]
    assert set(c) == {"small", "small+int8", "huge", "huge+int8"}
    assert c["huge"]["stopped"].startswith("over budget: ") and c["huge+int8"]["over_budget"] == []
    assert c["huge+int8"]["mb"] < c["huge"]["mb"] / 3 and c["huge+int8"]["runtime"] == "ONNX Runtime"
    # three variants in budget, two candidates trained at rung 1 (small once for both of its variants)
    assert sorted(trained[:2]) == [(8, 1), (512, 1)]
    assert all("1 epochs" in c[n]["selection_accuracy"] for n in ("small", "small+int8", "huge+int8"))
    # an int8 variant's accuracy is its export's, measured on the selection split
    candidates = tmp_path / "run" / "search" / "candidates"
    assert str(candidates / "huge-e1-int8") in evaluated and str(candidates / "small-e1-int8") in evaluated
    assert "of the 3 candidates within the budget (of 4)" in (tmp_path / "run" / "search" / "chosen" /
                                                               "README.md").read_text()
    # the 512-unit candidate alone: only its int8 variant is in budget, so it is chosen and shipped as the export
    # (its trainings and exports reused by key: nothing trained again)
    before = len(trained)
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 4.0, int8=True, space={"huge": space["huge"]}),
                 log=lambda m: None, functions=StageFunctions(student=student, evaluate=evaluate))
    assert len(trained) == before
    doc = json.loads((tmp_path / "run" / "search" / "search.json").read_text())
    assert doc["chosen"] == "huge+int8"
    chosen = tmp_path / "run" / "search" / "chosen"
    assert (chosen / "model.onnx").exists() and not (chosen / "model").exists()
    assert json.loads((chosen / "config.json").read_text())["transferset_export"]["quantize"] == "int8"
    # the report's row: the training's metrics at the export's selection accuracy, timed on ONNX Runtime
    metrics = json.loads((chosen / "metrics.json").read_text())
    assert metrics["quantize"] == "int8" and metrics["dev_accuracy"] == doc["candidates"]["huge+int8"][
        "selection_accuracy"]["2 epochs"]
    row = next(r for r in json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
               if r["name"].startswith("student: search ("))
    assert row["runtime"] == "ONNX Runtime" and row["dev_accuracy"] == metrics["dev_accuracy"]
    assert ("Search: budget 4 MB, each candidate's ONNX export timed on ONNX Runtime, and its int8 export (NAME+int8); "
            "chosen: huge+int8") in (tmp_path / "run" / "results.md").read_text()
    card = (chosen / "README.md").read_text()
    assert "An ONNX export (int8)" in card
    assert ("- chosen by a search: budget 4 MB, timed at batch 1 on one CPU thread (its int8 ONNX export on ONNX "
            "Runtime") in card and "of the 1 candidates within the budget (of 2)" in card
    tested = json.loads((tmp_path / "run" / "test" / "accuracy.json").read_text())["models"]
    assert tested["search"]["accuracy"] == pytest.approx(evaluate_ok(chosen, data / "dev.tsv"))


def evaluate_ok(model, data_file):
    return StageFunctions.evaluate(str(model), str(data_file))["accuracy"]


@pytest.mark.integration
def test_an_early_exit_variant_is_timed_at_its_bound_trained_beside_its_candidate_and_shipped_at_its_speed(
        tmp_path, sst2_dir, head_tsv, tiny_teacher):
    data = search_data(tmp_path, sst2_dir, head_tsv)
    exits = []

    def train_exits(model, scored, out, cfg, **kw):
        exits.append(model)
        return StageFunctions.exits(model, scored, out, cfg, **kw)

    space = {"t2": {"student": "transformer", "model": {"n_layer": 2}},
             "t1": {"student": "transformer", "model": {"n_layer": 1}},
             "small": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}}}
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 100.0, space=space, exit_speeds=[0.5], rungs=[1]),
                 log=lambda m: None, functions=StageFunctions(exits=train_exits))
    c = json.loads((tmp_path / "run" / "search" / "search.json").read_text())["candidates"]
    # a transformer's variant per speed; a BiLSTM has none; one layer cannot exit below its top (dropped before the
    # first stage, recorded as refused)
    assert set(c) == {"t2", "t2+exits@0.5", "t1", "t1+exits@0.5", "small"}
    assert c["t1+exits@0.5"]["stopped"] == "no early exits: one encoder layer; an exit below the top needs at least two"
    assert ", and a transformer with early exits (NAME+exits@S, in PyTorch, untrained: every row leaving at the " \
        "first branch); chosen: " in (tmp_path / "run" / "results.md").read_text()
    variant = c["t2+exits@0.5"]
    assert variant["speed"] == 0.5 and variant["runtime"] == "PyTorch" and variant["latency_1"] > 0
    # trained as its candidate (t2's folder), its exits beside it once, its accuracy measured at its speed
    candidates = tmp_path / "run" / "search" / "candidates"
    assert exits == [str(candidates / "t2-e1")]
    at_speed = StageFunctions.evaluate(str(candidates / "t2-e1-exits"), str(tmp_path / "run" / "data" /
                                                                           "validation.jsonl"), speed=0.5)
    assert variant["selection_accuracy"] == {"1 epochs": at_speed["accuracy"]}
    trained = variant["trained"]["1 epochs"]
    assert trained["latency_1"] > 0 and trained["mean_layers"] == at_speed["mean_layers"] and \
        1 <= trained["mean_layers"] <= 2 and trained["over_budget"] == []
    # shipped as it was chosen: the training's metrics at the variant's accuracy, answering at its speed
    target = tmp_path / "shipped"
    ship("t2+exits@0.5", variant, str(candidates / "t2-e1-exits"), str(target), "1 epochs")
    metrics = json.loads((target / "metrics.json").read_text())
    assert metrics["student"] == "transformer" and metrics["dev_accuracy"] == at_speed["accuracy"]
    assert metrics["exits"] == {"speed": 0.5, "latency_1": trained["latency_1"], "mean_layers": trained["mean_layers"]}
    shipped = StageFunctions.evaluate(str(target), str(tmp_path / "run" / "data" / "validation.jsonl"))
    assert shipped["speed"] == 0.5 and shipped["accuracy"] == at_speed["accuracy"]
    assert chosen_by({"budget": {"budget_mb": 100.0}, "runtime": "onnx", "rungs": [1], "chosen": "t2+exits@0.5",
                      "candidates": {"t2+exits@0.5": variant}})["timed"] == "trained, with early exits at speed 0.5"
    # another budget and a second speed reuse the candidate's exits (keyed by its training): none trained again
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 90.0, space=space, exit_speeds=[0.5, 0.9], rungs=[1]),
                 log=lambda m: None, functions=StageFunctions(exits=train_exits))
    c = json.loads((tmp_path / "run" / "search" / "search.json").read_text())["candidates"]
    assert exits == [str(candidates / "t2-e1")] and c["t2+exits@0.9"]["speed"] == 0.9
    assert c["t2+exits@0.9"]["trained"]["1 epochs"]["mean_layers"] <= trained["mean_layers"]  # a higher speed exits
