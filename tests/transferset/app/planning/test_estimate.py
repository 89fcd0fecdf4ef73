"""The plan's minutes (transferset/app/planning/estimate.py): the rows it counts, each stage's minutes from given rates, a
search's rungs (counted before its timing, or as the plan's timing of its candidates keeps them), the busy note."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from transferset.app.planning import estimate as est
from transferset.app.stages import costs, search, students
from transferset.app.planning import time_budget as tb
from transferset.app.run.runner import resolve_data
from transferset.data.splits import split_data
from transferset.runtime.errors import ConfigError

from plan_rates import RATES, ROWS, demo as _demo, total  # noqa: I001 (a helper beside the tests)


def test_the_rows_counted_before_the_run_are_those_the_data_stage_splits(tmp_path, sst2_dir, head_tsv):
    folder = tmp_path / "d"
    folder.mkdir()
    head_tsv(sst2_dir / "train.tsv", folder / "train.tsv", 600)
    head_tsv(sst2_dir / "dev.tsv", folder / "dev.tsv", 50)
    cfg, _ = _demo(tmp_path, folder, "validation={rows: 100, by: row}", "labeled_limit=200", "unlabeled_rows=150",
                   "augment.n_iter=3", "augment.unlabeled_n_iter=1")
    files = resolve_data(cfg.data, cfg.test, cfg.dev)
    rows = est.count_rows(cfg, files, None, False)
    split_data(files.train, str(tmp_path / "split"), cfg)
    stats = json.loads((tmp_path / "split" / "split.json").read_text())
    counted = (rows.labeled, rows.unlabeled, rows.selection, rows.rest)
    assert counted == (stats["labeled_rows"], stats["unlabeled_rows"], stats["validation_rows"], stats["rest_rows"])
    assert counted[:3] == (200, 150, 100) and len(rows.sample) == est.SAMPLE_ROWS
    # once the data stage is current, its split.json is read
    again = est.count_rows(cfg, files, str(tmp_path / "split"), True)
    assert (again.labeled, again.unlabeled, again.selection, again.rest) == counted
    # the transfer set before dedup: each row and its variants, and the demo's joined rows (0.5 per original)
    assert cfg.augment.ops == ("mask", "pos", "ngram", "join") and cfg.augment.joins == 0.5
    assert costs.transfer_rows(cfg, rows) == 200 * (1 + 3) + 150 * (1 + 1) + 175
    assert costs.transfer_rows(replace(cfg, augment=replace(cfg.augment, unlabeled_n_iter=None)), rows) == \
        200 * 4 + 150 * 4 + 175
    unjoined = replace(cfg, augment=replace(cfg.augment, ops=("mask", "pos", "ngram")))
    assert costs.transfer_rows(unjoined, rows) == 200 * 4 + 150 * 2


def test_each_stage_gets_its_rows_and_seconds_from_the_rates(tmp_path, sst2_dir):
    cfg, stages = _demo(tmp_path, sst2_dir)
    by = {e.stage: e for e in est.estimate(cfg, stages, ROWS, RATES, reused={"data"})}
    # 3,000 rows of 32 → 94 steps × 5 epochs at 1 s, and 5 evaluations of 1,000 rows at 100 rows/s
    assert by["teacher"].seconds == pytest.approx(470 + 50) and "470 steps" in by["teacher"].rows
    assert by["augment"].rows == "3,000 labeled × 3 + 14,000 unlabeled × 1 + 8,500 joined = 31,500 (before dedup)"
    assert by["score"].seconds == pytest.approx(costs.BEAM_START_S + 315)  # 31,500 rows at 100 rows/s
    # a student on gold labels alone iterates the labeled rows, a distilled one the whole transfer set; each epoch
    # ends with 16 batches of the selection split, forward only (a third of a step)
    assert by["students.labels_only"].seconds == pytest.approx(47 * 8 * 0.1 + 8 * 16 * 0.1 / 3)
    assert by["students.distilled"].seconds == pytest.approx(493 * 5 * 0.1 + 5 * 16 * 0.1 / 3)
    # the fixed parts measured (a student built and timed, a vocabulary read from the transfer set) add up
    more = replace(RATES, student_fixed_s={"labels_only": 5.0}, tokenize_rows_s=2300.0)
    by_more = {e.stage: e for e in est.estimate(cfg, stages, ROWS, more, reused={"data"})}
    assert by_more["students.labels_only"].seconds == pytest.approx(by["students.labels_only"].seconds + 5
                                                                                + 31_500 / 2300)
    assert by_more["students.distilled"].seconds == by["students.distilled"].seconds  # the teacher's vocabulary
    assert by["data"].reused and by["data"].seconds == 0
    # contextual vectors: the transfer set's first texts (31,500 here, at most 20,000) through the teacher first
    ctx_cfg = replace(cfg, students={**cfg.students, "distilled": replace(cfg.students["distilled"],
                                                                          vocab={"embed_init": "contextual"})})
    by_ctx = {e.stage: e for e in est.estimate(ctx_cfg, stages, ROWS, RATES, reused={"data"})}
    assert by_ctx["students.distilled"].seconds == pytest.approx(by["students.distilled"].seconds + 20_000 / 100.0)
    lines = est.plan_lines(list(by.values()), RATES)
    assert lines[0] == "plan, estimated on this machine (given):" and "reused" in lines[1]


SEARCH = ("search.budget_ms=1", "search.rungs=[1, 3]", "search.keep=0.5",
          "search.space={fast: {student: static}, slow: {student: bilstm}}")


def test_a_search_is_planned_as_its_rungs_counting_the_slowest_candidates_and_its_last_rung_is_cut(tmp_path,
                                                                                                  sst2_dir):
    cfg, stages = _demo(tmp_path, sst2_dir, *SEARCH)
    rates = replace(RATES, student_step_s={**RATES.student_step_s, "search.fast": 0.1, "search.slow": 0.2},
                    student_fixed_s={"search.fast": 2.0, "search.slow": 3.0})
    reused = {s.name for s in stages} - {"search", "test", "report"}
    by = {e.stage: e for e in est.estimate(cfg, stages, ROWS, rates, reused)}
    # 31,500 transfer rows of 64 → 493 steps an epoch, and 16 selection batches (a third of a step each); rung 1
    # trains both 1 epoch, rung 2 the slower one (the one kept is not known before the timing) 3 epochs; each
    # candidate's fixed seconds once per rung it may reach, and once for its timing
    epoch = {"fast": 493 * 0.1 + 16 * 0.1 / 3, "slow": 493 * 0.2 + 16 * 0.2 / 3}
    fixed = {"fast": 2.0, "slow": 3.0}
    want = sum(fixed.values()) + epoch["fast"] + fixed["fast"] + epoch["slow"] + fixed["slow"] + 3 * epoch["slow"] \
        + fixed["slow"]
    assert by["search"].seconds == pytest.approx(want)
    assert by["search"].rows == "2 candidates, before the budget's timing drops any; 2 × 1 epochs, 1 × 3 epochs"
    # a budget cuts the last rung (after the students' epochs, which are reused here), down to one more than the
    # rung before
    budget = (total(cfg, stages, reused, rates) - epoch["slow"] + 1e-3) / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, rates, reused, budget)
    assert cuts == ["search's last rung 3 → 2"] and cut.search.rungs == (1, 2)
    with pytest.raises(ConfigError, match=r"even the smallest plan \(search's last rung 3 → 2\)"):
        tb.fit(cfg, stages, ROWS, rates, reused, (total(cfg, stages, reused, rates) - 2 * epoch["slow"]) / 60)
    # a candidate the calibration could not time leaves the search not estimated, saying which
    by = {e.stage: e for e in est.estimate(cfg, stages, ROWS, RATES, reused)}
    assert by["search"].seconds is None and by["search"].rows.endswith("(fast not calibrated)")


def test_a_plan_measured_on_a_busy_machine_says_so():
    estimates = [costs.Estimate("teacher", "3,000 rows", 60.0)]
    quiet = est.plan_lines(estimates, replace(RATES, load=1.5, cores=2))
    assert not any("busy" in line for line in quiet) and est.plan_lines(estimates, RATES) == quiet
    busy = est.plan_lines(estimates, replace(RATES, load=4.2, cores=2), ["teacher.epochs 5 → 2"])
    assert busy[-1] == ("measured on a busy machine (load 4.2 on 2 cores): the minutes may be several times what "
                        "the stages take once the other work ends; the budget's cuts follow them")


def test_a_transformer_candidates_early_exits_add_its_forward_over_the_transfer_set_at_each_rung():
    from transferset.app.stages.search import candidate_configs
    from transferset.config.search import SearchConfig

    sc = SearchConfig(budget_ms=1, rungs=(1, 2), int8=False, space={
        "t": {"student": "transformer", "model": {"n_layer": 2}}, "b": {"student": "bilstm"}})
    rates = replace(RATES, student_step_s={**RATES.student_step_s, "search.t": 0.3, "search.b": 0.01},
                    student_fixed_s={})
    batch = candidate_configs(sc)["t"].batch_size
    with_exits = search.search_estimate("search", sc, 23_000, ROWS, rates).seconds
    without = search.search_estimate("search", replace(sc, exit_speeds=()), 23_000, ROWS, rates).seconds
    # the slower candidate (t) is counted at both rungs: its forward over the 23,000 rows once per rung
    assert with_exits - without == pytest.approx(2 * math.ceil(23_000 / batch) * 0.3 / 3)


def test_a_static_candidates_contextual_vectors_are_counted_at_its_first_rung_only():
    from transferset.config.search import SearchConfig

    sc = SearchConfig(budget_ms=1, rungs=(1, 2), int8=False, space={"s": {"student": "static"}})
    rates = replace(RATES, student_step_s={**RATES.student_step_s, "search.s": 0.1}, student_fixed_s={})
    teacher_rows = search.search_estimate("search", sc, 23_000, ROWS, rates).seconds
    contextual = replace(sc, space={"s": {"student": "static", "vocab": {"embed_init": "contextual"}}})
    # the first rung reads 20,000 texts through the teacher at its scoring rate; the second reads the cached table
    assert search.search_estimate("search", contextual, 23_000, ROWS, rates).seconds == pytest.approx(
        teacher_rows + 20_000 / RATES.score_rows_s)

def test_a_search_timed_by_the_plan_counts_its_variants_in_budget_each_candidate_trained_once():
    from transferset.app.stages.search import candidate_configs
    from transferset.config.search import SearchConfig

    sc = SearchConfig(budget_ms=1, rungs=(1, 2), space={
        "t": {"student": "transformer", "model": {"n_layer": 2}}, "b": {"student": "bilstm"},
        "s": {"student": "static"}})
    steps = {"search.t": 0.3, "search.b": 0.01, "search.s": 0.001}
    rates = replace(RATES, student_step_s={**RATES.student_step_s, **steps}, student_fixed_s={})

    def timed(before=None, **ms):
        variants = {n: {"latency_1": v, "mb": 1.0, "teacher_ms": None} for n, v in ms.items()}
        return replace(rates, probed={"search": {"variants": variants, "before": before, "seconds": 7.0}})

    def seconds(c, epochs, with_exits=False):
        one = students.student_estimate("search", replace(candidate_configs(sc)[c], epochs=epochs), 23_000, ROWS, rates,
                                   key=f"search.{c}").seconds
        return one + (search.exits_seconds(candidate_configs(sc)[c], sc, 23_000, rates, f"search.{c}")
                      if with_exits else 0.0)

    # b and its int8 export in budget (one training for both), s's int8 alone; t and its variants over: 3 variants,
    # 2 candidates at rung 1, then the 2 best of 3 (ceil 1.5): at most both candidates again
    e = search.search_estimate("search", sc, 23_000, ROWS, timed(**{
        "b": 0.9, "b+int8": 0.5, "s": 1.2, "s+int8": 0.8, "t": 5.0, "t+int8": 2.0, "t+exits@0.5": 3.0}))
    assert e.rows == "3 of 7 variants in budget (timed untrained), 2 candidates; 3 × 1 epochs, 2 × 2 epochs"
    assert e.seconds == pytest.approx(seconds("b", 1) + seconds("s", 1) + seconds("b", 2) + seconds("s", 2))
    # t's early exits alone in budget: t trains, and its exits' forward pass counts; the last rung keeps one
    e = search.search_estimate("search", sc, 23_000, ROWS, timed(**{"t": 5.0, "t+exits@0.5": 0.9, "b": 3.0}))
    assert e.rows.startswith("1 of 3 variants in budget (timed untrained), 1 candidate; ")
    assert e.seconds == pytest.approx(seconds("t", 1, True) + seconds("t", 2, True))
    # none in budget: the search will refuse, and nothing is counted
    e = search.search_estimate("search", sc, 23_000, ROWS, timed(t=5.0, b=3.0))
    assert (e.rows, e.seconds) == ("none of 2 variants in budget (timed untrained): the search refuses", 0.0)
    # timed before the teacher was trained: the same count, and the search's own timing later as long as the plan's
    early = search.search_estimate("search", sc, 23_000, ROWS, timed(before="on the teacher's base model", **{
        "b": 0.9, "b+int8": 0.5, "s": 1.2, "s+int8": 0.8, "t": 5.0, "t+int8": 2.0, "t+exits@0.5": 3.0}))
    assert early.rows.startswith("3 of 7 variants in budget (timed untrained, on the teacher's base model), 2 cand")
    assert early.seconds == pytest.approx(seconds("b", 1) + seconds("s", 1) + seconds("b", 2) + seconds("s", 2) + 7.0)


def test_each_stage_kind_estimates_its_own_stages_and_the_plan_counts_the_run_besides_them(tmp_path, sst2_dir):
    """StageDef.estimate: the exports, the test stage and the report's timing are in the plan's minutes (they were
    "not estimated": 1-2 minutes of a 15-minute run), and estimate.py asks each stage, naming none."""
    import ast
    import inspect

    from transferset.app.stages import compress, heldout
    from transferset.app.run.runner import plan_stages

    cfg, stages = _demo(tmp_path, sst2_dir)
    rates = replace(RATES, seconds=12.0, teacher_parameters=22_700_000, score_fixed_s=3.0)
    rows = replace(ROWS, test=872)
    by = {e.stage: e for e in est.estimate(cfg, stages, rows, rates, set())}
    assert by["compress.ship.teacher"].seconds == pytest.approx(compress.EXPORT_S + compress.EXPORT_S_PER_M * 22.7)
    assert by["compress.ship.distilled"].seconds == pytest.approx(compress.EXPORT_S)
    # the teacher over 872 rows at 100 rows/s and its ONNX export at EXPORT_TIMING times that, each loaded (3 s); four
    # students at STUDENT_TEST_S
    export = costs.EXPORT_TIMING
    assert by["test"].seconds == pytest.approx((1 + export) * 8.72 + 2 * 3.0 + 4 * heldout.STUDENT_TEST_S)
    assert by["test"].rows == "6 models × 872 rows"
    plan = plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev))
    calibration, report = tb.overhead_estimates(cfg, plan, rows, rates)
    assert calibration.seconds == 12.0
    # 5 rounds of 16 rows at batch 1 and 128 at batch 64, after 1 + 64 untimed, on each model: the teacher at a row
    # per 1 / 100 s where one thread's row was not measured, its export at EXPORT_TIMING times that and evaluated on
    # the 1,000 selection rows too
    assert est.timed_rows(1000, cfg.report) == 785 and est.timed_rows(20, cfg.report) == 5 * (16 + 20) + 1 + 20
    assert report.seconds == pytest.approx((1 + export) * 785 / 100 + 2 * 3.0 + export * 1000 / 100
                                           + 4 * est.STUDENT_TIMING_S)
    # measured: the test stage at the teacher's fp32 rate (scoring ran at bf16), the report at its row on one thread
    fp32 = replace(rates, fp32_rows_s=50.0, teacher_row_s=0.04)
    tested = {e.stage: e for e in est.estimate(cfg, stages, rows, fp32, set())}["test"]
    assert tested.seconds == pytest.approx((1 + export) * 872 / 50 + 2 * 3.0 + 4 * heldout.STUDENT_TEST_S)
    assert tb.overhead_estimates(cfg, plan, rows, fp32)[1].seconds == pytest.approx(
        (1 + export) * 785 * 0.04 + 2 * 3.0 + export * 1000 / 50 + 4 * est.STUDENT_TIMING_S)
    # an ensemble's members are timed as the teacher is, and none is evaluated on the selection split
    members = est.report_estimate(["teacher", "teacher 1", "teacher 2"], 1000, cfg.report, fp32)
    assert members.seconds == pytest.approx(3 * 785 * 0.04 + 3 * 3.0)
    assert all(e.seconds is not None for e in by.values() if e.stage not in ("data", "dev"))
    body = ast.parse(inspect.getsource(est.estimate)).body[0].body[1:]  # its docstring left out
    assert {n.value for part in body for n in ast.walk(part) if isinstance(n, ast.Constant)} <= {"", 0.0, True, None}
