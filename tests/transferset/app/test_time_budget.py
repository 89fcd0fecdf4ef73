"""The plan cut to fit `budget_minutes` (transferset/app/time_budget.py): the cuts in their order and only as deep
as needed, the refusal with the minimum, no cut that changes a reused stage's key, the plan printed before the first
stage (or alone), a rerun keeping its cuts."""
from __future__ import annotations

from dataclasses import replace

import pytest

from transferset.app import estimate as est
from transferset.app import time_budget as tb
from transferset.app.runner import load_config, plan_stages, resolve_data, run_pipeline
from transferset.runtime.errors import ConfigError

from plan_rates import RATES, ROWS, demo, total  # noqa: I001 (a helper beside the tests)


def test_a_budget_cuts_the_variants_first_and_only_as_deep_as_it_needs(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=4", "augment.unlabeled_n_iter=4")
    one_cut = replace(cfg, augment=replace(cfg.augment, unlabeled_n_iter=2))
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, set(), (total(one_cut, stages) + 1e-3) / 60)
    assert cuts == ["augment.unlabeled_n_iter 4 → 2"] and cut.augment == one_cut.augment
    assert tb.fit(cfg, stages, ROWS, RATES, set(), total(cfg, stages) / 60 + 1) == (cfg, [])
    # deeper: no unlabeled variants, one per labeled row, the students' epochs, then half the unlabeled rows
    deep = replace(cfg, augment=replace(cfg.augment, unlabeled_n_iter=0, n_iter=1), unlabeled_limit=7000,
                   students={n: replace(s, epochs=1) for n, s in cfg.students.items()})
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, set(), (total(deep, stages) + 1e-3) / 60)
    assert cuts == ["augment.unlabeled_n_iter 4 → 0", "augment.n_iter 4 → 1", "students' epochs 8 → 1",
                    "unlabeled rows 14,000 → 7,000"]
    assert cut.teacher.epochs == 5 and cut.unlabeled_limit == 7000
    assert est.plan_lines(est.estimate(cut, stages, ROWS, RATES, set()), RATES, cuts)[-1] == \
        "cut to fit budget_minutes: " + "; ".join(cuts)


def test_a_budget_the_smallest_plan_cannot_meet_is_refused_with_the_minimum(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir)
    with pytest.raises(ConfigError, match=r"^budget_minutes=0.5: even the smallest plan \(augment.n_iter 2 → 1; "
                                          r".*teacher.epochs 5 → 1\) takes about .* give at least \d+, or fewer rows$"):
        tb.fit(cfg, stages, ROWS, RATES, set(), 0.5)


def test_a_cut_never_changes_the_key_of_a_stage_the_run_reuses(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir)
    reused = {"data", "teacher", "augment", "score", "dev", "dev.score"}
    budget = (total(cfg, stages, reused) - 1) / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, reused, budget)
    assert [c.split(" ")[0] for c in cuts] == ["students'"]  # the variants, rows and teacher are reused
    assert cut.augment == cfg.augment and cut.teacher == cfg.teacher


def test_run_prints_its_plan_before_its_first_stage_and_runs_the_cut_config(tmp_path, sst2_dir):
    from test_runner import RecordingStages

    measured = []

    def measure(cfg, rows, will_run):
        measured.append(set(will_run))
        return RATES

    rec, log = RecordingStages(), []
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "unlabeled_rows=50",
                                            "augment.n_iter=8"])
    run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=measure)
    first_stage = next(i for i, m in enumerate(log) if "running →" in m)
    plan = next(i for i, m in enumerate(log) if m.startswith("plan, estimated on this machine (given)"))
    assert plan < first_stage and any(m.strip().startswith("teacher") and "min" in m for m in log[plan:first_stage])
    assert {"teacher", "augment", "score", "students.distilled"} <= measured[0]
    # again: every stage is current, the plan says so and measures nothing it would not run
    log.clear()
    run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=measure)
    assert [m.split()[-1] for m in log if m.startswith("  teacher") or m.startswith("  augment")] == ["reused"] * 2
    assert "teacher" not in measured[1] and "augment" not in measured[1]
    # a budget in a fresh folder: the run's augment stage makes the cut transfer set
    rec, log = RecordingStages(), []
    small = replace(cfg, run_dir=str(tmp_path / "b"))
    budget = (est.total_seconds(est.estimate(replace(small, augment=replace(small.augment, n_iter=2)),
                                             plan_stages(small, resolve_data(small.data, small.test, small.dev)).stages,
                                             est.Rows(3000, 50, 1000), RATES, {"data"})) + 1) / 60
    run_pipeline(replace(small, budget_minutes=budget), log=log.append, functions=rec.functions(), measure=measure)
    assert rec.seen["augment"][0].n_iter == 2 and "cut to fit budget_minutes: augment.n_iter 8 → 2" in log


def test_a_plan_alone_is_printed_and_nothing_runs_or_is_written(tmp_path, sst2_dir):
    from test_runner import RecordingStages

    rec, log = RecordingStages(), []
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "unlabeled_rows=50"])
    assert run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=lambda c, r, w: RATES,
                        plan_only=True) is None
    assert log[0] == "plan, estimated on this machine (given):" and any(m.startswith("  teacher") for m in log)
    assert not any("running →" in m for m in log) and not rec.seen
    assert not (tmp_path / "r").exists()


def test_a_rerun_under_the_same_budget_keeps_the_cuts_the_last_run_made(tmp_path, sst2_dir):
    """Rates measured again differ on a busy machine: another cut would run every stage again."""
    from test_runner import RecordingStages

    rates = [RATES]
    rec, log = RecordingStages(), []
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "unlabeled_rows=50",
                                            "augment.n_iter=8"])
    budget = (est.total_seconds(est.estimate(replace(cfg, augment=replace(cfg.augment, n_iter=2)),
                                             plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev)).stages,
                                             est.Rows(3000, 50, 1000), RATES, {"data"})) + 1) / 60
    cfg = replace(cfg, budget_minutes=budget)
    run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=lambda c, r, w: rates[0])
    assert rec.seen["augment"][0].n_iter == 2
    log.clear()
    rates[0] = replace(RATES, teacher_step_s=0.5)  # faster now: a fresh fit would cut less
    run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=lambda c, r, w: rates[0])
    assert not any("running →" in m for m in log) and "cut to fit budget_minutes: augment.n_iter 8 → 2" in log


def test_a_deep_later_cut_gives_the_earlier_cuts_back_as_far_as_the_budget_allows(tmp_path, sst2_dir):
    """A slow teacher: cutting its epochs is what it takes, and the unlabeled rows it first cut to none come back."""
    cfg, stages = demo(tmp_path, sst2_dir)
    slow = replace(RATES, teacher_step_s=10.0)
    three = replace(cfg, teacher=replace(cfg.teacher, epochs=3))
    budget = est.total_seconds(est.estimate(three, stages, ROWS, slow, set())) / 60 + 1e-3
    cut, cuts = tb.fit(cfg, stages, ROWS, slow, set(), budget)
    assert "unlabeled rows 14,000 → 0" in cuts and cut.teacher.epochs < 5  # the forward pass went that deep
    assert cut.unlabeled_limit != 0 and est.total_seconds(est.estimate(cut, stages, ROWS, slow, set())) <= budget * 60

