"""transferset/app/stages/costs.py: what a stage's estimate reads and gives (the plan's arithmetic is in
tests/transferset/app/planning/test_estimate.py, the cuts in test_time_budget.py)."""
import math
from dataclasses import replace

import pytest

from transferset.app.run.runner import load_config
from transferset.app.stages import costs


def _cfg(tmp_path, sst2_dir, *overrides):
    return load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", *overrides])


def test_halvings_and_epoch_losses_are_the_levers_steps(tmp_path):
    assert costs.halvings(20, 4) == [10, 5, 4] and costs.halvings(8, 0) == [4, 2, 1, 0] and costs.halvings(4, 4) == []
    loss = costs.epoch_loss(3.0, 1.0)
    assert [loss(e) for e in (2, 3, 4, 5)] == [3.0, 1.0, 0.5, pytest.approx(1 / 3)]


def test_finer_steps_cost_their_share_of_a_halving():
    assert costs.steps(20, 4) == [16, 13, 10, 8, 6, 5, 4] and costs.steps(3, 0) == [2, 1, 0]
    assert costs.steps(4, 4) == [] and costs.steps(2, 4) == []
    values = costs.steps(20, 4)
    loss = costs.halving_loss(20, values, 0.3)
    # a step from v to w costs 0.3 × log2(v / w): the steps from 20 to 4 cost what log2(5) halvings do
    assert loss(20) == pytest.approx(0.3 * math.log2(20 / 16))
    assert sum(loss(v) for v in [20, *values[:-1]]) == pytest.approx(0.3 * math.log2(5))
    assert costs.halving_loss(1, [0], 0.3)(1) == 0.3  # to none: one halving


def test_a_models_time_against_the_teachers_by_its_name():
    names = ["teacher", "teacher 1", "teacher (ONNX)", "teacher (int8)", "distilled (ONNX)", "labels_only"]
    assert [costs.made_from_teacher(n) for n in names] == [False, False, True, True, False, False]
    assert [costs.teacher_weight(n) for n in names] == [1.0, 1.0, costs.EXPORT_TIMING, costs.EXPORT_TIMING, 0.0, 0.0]


def test_a_costing_reads_the_cut_config_and_the_rows_under_its_limit(tmp_path, sst2_dir):
    cfg = _cfg(tmp_path, sst2_dir, "augment.n_iter=3", "augment.unlabeled_n_iter=1", "augment.ops=[mask]")
    rows = costs.Rows(labeled=200, unlabeled=150, selection=50, rest=10)
    limited = costs.with_limit(replace(cfg, unlabeled_limit=100), rows)
    assert (limited.unlabeled, limited.rest) == (100, 60)  # what the limit leaves out is the rest's
    assert costs.with_limit(cfg, rows) is rows
    c = costs.Costing(cfg, rows, costs.Rates())
    assert c.transfer == 200 * (1 + 3) + 150 * (1 + 1) and c.members == 1
    assert costs.Costing(replace(cfg, teacher_seeds=(1, 2, 3)), rows, costs.Rates()).members == 3


def test_a_pipeline_stage_is_its_start_its_fixed_seconds_and_its_rows_at_the_rate():
    e = costs.pipeline_estimate("score", "1,000 rows", 1000, 100.0, fixed=2.0)
    assert e.seconds == pytest.approx(costs.BEAM_START_S + 2.0 + 10.0) and e.rows == "1,000 rows"
    assert costs.pipeline_estimate("score", "", 1000, None).seconds is None  # not calibrated: not estimated
