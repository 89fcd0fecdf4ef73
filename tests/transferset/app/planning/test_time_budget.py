"""The plan cut to fit `budget_minutes` (transferset/app/planning/time_budget.py): the cheapest cuts per second saved first
and only as deep as needed, the floor of rows a distilled student sees, the refusal with the minimum, no cut that changes a reused stage's key, the plan printed before the first
stage (or alone), a rerun keeping its cuts."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from transferset.app.planning import estimate as est
from transferset.app.stages import costs
from transferset.app.planning import time_budget as tb
from transferset.app.run.runner import load_config, plan_stages, resolve_data, run_pipeline
from transferset.runtime.errors import ConfigError

from plan_rates import RATES, ROWS, demo, total  # noqa: I001 (a helper beside the tests)


def test_a_budget_cuts_where_the_student_loses_least_per_second_and_only_as_deep_as_it_needs(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=16", "augment.unlabeled_n_iter=4")
    one_cut = replace(cfg, augment=replace(cfg.augment, unlabeled_n_iter=2))
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, set(), (total(one_cut, stages) + 1e-3) / 60)
    assert cuts == ["augment.unlabeled_n_iter 4 → 2"] and cut.augment == one_cut.augment
    assert tb.fit(cfg, stages, ROWS, RATES, set(), total(cfg, stages) / 60 + 1) == (cfg, [])
    # deeper: the variants (0.3 points a halving, in steps of about a fifth: 16, 13, 10, 8, 6, 5, 4), before any
    # student's epoch (its eighth costs 0.17 points but saves seconds of both students' epochs at 0.1 s a step: more
    # per second) and before half the unlabeled rows (1.0), and only as deep as the budget needs: 8 does not fit
    budget = total(cfg, stages) * 0.5 / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, set(), budget)
    assert cuts == ["augment.unlabeled_n_iter 4 → 0", "augment.n_iter 16 → 6"]
    assert {n: s.epochs for n, s in cut.students.items()} == {n: s.epochs for n, s in cfg.students.items()}
    assert total(cut, stages) <= budget * 60 < total(replace(cut, augment=replace(cut.augment, n_iter=8)), stages)
    # a slow teacher: its epochs are what a second saved costs least
    slow = replace(RATES, teacher_step_s=10.0)
    budget = total(cfg, stages, rates=slow) * 0.7 / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, slow, set(), budget)
    assert cuts == ["teacher.epochs 5 → 3", "augment.unlabeled_n_iter 4 → 3", "augment.n_iter 16 → 13"]
    assert cut.teacher.optim == cfg.teacher.optim  # more than one epoch: the run's own rate


def test_a_step_a_later_cut_made_needless_is_given_back(tmp_path, sst2_dir):
    """At 29 % of the plan the unlabeled rows' variants went to 0 first, then deeper cuts made room: one comes back."""
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=16", "augment.unlabeled_n_iter=4")
    budget = total(cfg, stages) * 0.29 / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, set(), budget)
    assert cuts == ["unlabeled rows 14,000 → 3,500", "teacher.epochs 5 → 3", "augment.unlabeled_n_iter 4 → 1",
                    "augment.n_iter 16 → 4"]  # in the stage kinds' order
    assert total(cut, stages) <= budget * 60
    zero = replace(cut, augment=replace(cut.augment, unlabeled_n_iter=0))
    assert total(zero, stages) < total(cut, stages)  # the greedy pass had taken it to 0


def test_no_cut_leaves_a_distilled_student_seeing_fewer_than_four_times_the_labeled_rows(tmp_path, sst2_dir):
    """Below MIN_SEEN the distilled student learned no more than the labels-only one: a budget that needs it is
    refused, saying so and the minutes the smallest plan takes."""
    rows = costs.Rows(labeled=3000, unlabeled=0, selection=1000)
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=1", "students.distilled.epochs=2",
                       "students.labels_only.epochs=2")
    assert tb.sees_enough(cfg, rows)  # 3,000 × 2 + 1,500 joined = 7,500 rows × 2 epochs ≥ 4 × 3,000
    one = replace(cfg, students={n: replace(s, epochs=1) for n, s in cfg.students.items()})
    assert not tb.sees_enough(one, rows)
    full = est.total_seconds(est.estimate(cfg, stages, rows, RATES, set()))
    cut, cuts = tb.fit(cfg, stages, rows, RATES, set(), full * 0.5 / 60)
    assert cuts == ["teacher.epochs 5 → 1"] and cut.students == cfg.students
    with pytest.raises(ConfigError, match=r"\(teacher.epochs 5 → 1\) takes about 4.2 minutes on this machine; a "
                                          r"distilled student sees at least 4 times the labeled rows \(rows × "
                                          r"epochs\), below which it learned no more than the labels-only student: "
                                          r"give at least 5, or fewer rows$"):
        tb.fit(cfg, stages, rows, RATES, set(), full * 0.3 / 60)


def test_a_cut_below_what_a_kind_needs_warns_with_the_budget_that_keeps_it(tmp_path, sst2_dir):
    """A teacher cut to 1 epoch (the teacher kind needs 2 for distillation to pay): the plan says so and names the
    budget at which the teacher keeps 2, the other cuts as they are; a cut that keeps 2 warns nothing."""
    rows = costs.Rows(labeled=3000, unlabeled=0, selection=1000)
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=1", "students.distilled.epochs=2",
                       "students.labels_only.epochs=2")
    full = est.total_seconds(est.estimate(cfg, stages, rows, RATES, set()))
    cut, cuts = tb.fit(cfg, stages, rows, RATES, set(), full * 0.5 / 60)
    assert cuts == ["teacher.epochs 5 → 1"]
    [line] = tb.shortfalls(cfg, cut, stages, rows, RATES, set(), 30.0)
    two = replace(cut, teacher=replace(cut.teacher, epochs=2))
    minutes = (est.total_seconds(est.estimate(two, stages, rows, RATES, set())) + 30.0) / 60
    assert line == (f"warning: the budget cut teacher.epochs to 1 (below 2): a teacher's second epoch bought 3.7 "
                    f"points of selection accuracy on the sst2 proxy, and a distilled student learns what its teacher "
                    f"knows; --budget-minutes {math.ceil(minutes)} keeps 2")
    assert tb.shortfalls(cfg, two, stages, rows, RATES, set(), 30.0) == []
    one = replace(cfg, teacher=replace(cfg.teacher, epochs=1))  # asked for 1: not the budget's doing
    assert tb.shortfalls(one, one, stages, rows, RATES, set(), 30.0) == []


def test_a_teacher_the_budget_cuts_to_one_epoch_trains_at_the_one_epoch_rate_unless_the_run_set_its_own(
        tmp_path, sst2_dir):
    """One epoch at 1.5e-4 beat one at the default 5e-5 on both proxies' selection (benchmarks/teacher_lr.py): the
    budget's one-epoch teacher takes it, the plan says so, a cut that keeps more epochs or a rate the run set does
    not, and a rerun under the same budget recognises the cut (earlier_cut)."""
    from transferset.app.stages.teacher import ONE_EPOCH_LR

    rows = costs.Rows(labeled=3000, unlabeled=0, selection=1000)
    overrides = ("augment.n_iter=1", "students.distilled.epochs=2", "students.labels_only.epochs=2")
    cfg, stages = demo(tmp_path, sst2_dir, *overrides)
    budget = est.total_seconds(est.estimate(cfg, stages, rows, RATES, set())) * 0.5 / 60
    cut, cuts = tb.fit(cfg, stages, rows, RATES, set(), budget)
    assert cuts == ["teacher.epochs 5 → 1"] and cut.teacher.optim.lr == ONE_EPOCH_LR == 1.5e-4
    assert cut.teacher.optim.weight_decay == cfg.teacher.optim.weight_decay
    assert tb.changes(cfg, cut) == ["teacher.epochs 5 → 1", "teacher.optim.lr 5e-05 → 0.00015"]
    [lever] = [lv for lv in tb.levers(cfg, stages, rows) if lv.name == "teacher.epochs"]
    assert lever.apply(cut, None).teacher == cfg.teacher and lever.apply(cut, 2).teacher.optim.lr == 5e-5
    with_budget = replace(cfg, budget_minutes=budget)
    assert tb.earlier_cut(with_budget, replace(cut, budget_minutes=budget)) == replace(cut, budget_minutes=budget)
    # a rate the run set is its own at any number of epochs
    own, stages = demo(tmp_path, sst2_dir, *overrides, "teacher.optim.lr=1e-4")
    cut, cuts = tb.fit(own, stages, rows, RATES, set(), budget)
    assert cuts == ["teacher.epochs 5 → 1"] and cut.teacher.optim.lr == 1e-4
    # a teacher the run asked to fine-tune 1 epoch is not the budget's cut: the default rate
    one, stages = demo(tmp_path, sst2_dir, *overrides, "teacher.epochs=1")
    assert tb.fit(one, stages, rows, RATES, set(), budget)[0].teacher.optim.lr == 5e-5


def test_a_budget_the_smallest_plan_cannot_meet_is_refused_with_the_minimum(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir)
    with pytest.raises(ConfigError, match=r"^budget_minutes=0.5: even the smallest plan \(unlabeled rows 14,000 → 0; "
                                          r"teacher.epochs 5 → 1; students' epochs 8 → 2\) takes about .* give at least \d+, or fewer rows$"):
        tb.fit(cfg, stages, ROWS, RATES, set(), 0.5)
    # the variants stay at MIN_VARIANTS per labeled row: a budget that needs fewer is refused, saying why
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=16")
    with pytest.raises(ConfigError, match=r"augment.n_iter 16 → 4.*the variants per labeled row stay at 4 or more, "
                                          r"below which the distilled student fell behind the labels-only one: give "
                                          r"at least \d+"):
        tb.fit(cfg, stages, ROWS, RATES, set(), 0.5)


def test_a_cut_never_changes_the_key_of_a_stage_the_run_reuses(tmp_path, sst2_dir):
    cfg, stages = demo(tmp_path, sst2_dir)
    reused = {"data", "teacher", "augment", "score", "dev", "dev.score"}
    budget = (total(cfg, stages, reused) - 1) / 60
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, reused, budget)
    assert [c.split(" ")[0] for c in cuts] == ["students'"]  # the variants, rows and teacher are reused
    assert cut.augment == cfg.augment and cut.teacher == cfg.teacher


def test_run_prints_its_plan_before_its_first_stage_and_runs_the_cut_config(tmp_path, sst2_dir, monkeypatch):
    from recording_stages import RecordingStages

    clock = _Clock(monkeypatch)

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
    budget = _budget(replace(small, augment=replace(small.augment, n_iter=4)))
    run_pipeline(replace(small, budget_minutes=budget), log=log.append, functions=clock.timed(rec, small),
                 measure=measure)
    assert rec.seen["augment"][0].n_iter == 4 and "cut to fit budget_minutes: augment.n_iter 8 → 4" in log
    assert not any(m.startswith("re-fitted") for m in log)  # the teacher took the minutes it was planned to


class _Clock:
    """The budget's clock (time_budget.clock), stopped but for the fake teacher, which spends its planned seconds
    and `extra`."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(tb, "clock", lambda: self.now)

    def timed(self, rec, cfg, extra: float = 0.0):
        stages = plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev)).stages
        rows = costs.Rows(3000, 50, 1000, test=872)

        def teacher(tc, **kwargs):
            cut = replace(cfg, teacher=tc)
            self.now += next(e.seconds for e in est.estimate(cut, stages, rows, RATES, set()) if e.stage == "teacher")
            self.now += extra
            return rec.teacher(tc, **kwargs)

        return replace(rec.functions(), teacher=teacher)


def test_after_each_stage_the_stages_still_to_run_are_refitted_to_the_minutes_left(tmp_path, sst2_dir, monkeypatch):
    """A teacher quicker than planned gives its minutes back to the transfer set; a slower one takes them from the
    stages after it; each stage runs within its share of what is left (transferset.runtime.deadline)."""
    from recording_stages import RecordingStages

    from transferset.runtime import deadline

    cfg = load_config("configs/demo.yaml", [f"data={sst2_dir}", "unlabeled_rows=50", "augment.n_iter=8"])
    budget = _budget(replace(cfg, augment=replace(cfg.augment, n_iter=4)))
    seen = {}
    for name, extra in (("quick", -600.0), ("slow", 120.0)):
        clock, rec, log = _Clock(monkeypatch), RecordingStages(), []
        student = rec.student
        rec.student = lambda c, *a, **k: (seen.setdefault(name, []).append(deadline.seconds_left()), student(c, *a, **k))
        run = replace(cfg, run_dir=str(tmp_path / name), budget_minutes=budget)
        run_pipeline(run, log=log.append, functions=clock.timed(rec, run, extra), measure=lambda c, r, w: RATES)
        assert "cut to fit budget_minutes: augment.n_iter 8 → 4" in log
        refits = [m for m in log if m.startswith("re-fitted")]
        recorded = load_config(str(tmp_path / name / "config.yaml"))
        assert recorded.augment.n_iter == rec.seen["augment"][0].n_iter  # a rerun keeps the cuts the run made
        if name == "quick":  # the teacher's 600 s given back: the variants come back in full
            assert refits == [f"re-fitted to the {(budget * 60 - clock.now) / 60:.1f} minutes left: "
                              "augment.n_iter 4 → 8"] and rec.seen["augment"][0].n_iter == 8
        else:  # 120 s over: the stages after the teacher are cut (the students' epochs: the variants are at 4, the
            # least a cut leaves), then each stage after it, taking no time here, gives some back
            steps = [[(int(a.replace(",", "")), int(b.replace(",", ""))) for a, _, b in
                      (c.split()[1:] for c in m.split(": ", 1)[1].split("; "))] for m in refits]
            assert refits[0].startswith(f"re-fitted to the {(budget * 60 - clock.now) / 60:.1f} minutes left: "
                                        "students.")
            assert all(b < a for a, b in steps[0]) and all(b > a for later in steps[1:] for a, b in later)
        assert [s.epochs for s, *_ in rec.seen["students"]] == [recorded.students[n].epochs
                                                                for n in ("labels_only", "distilled")]
        # each student ran within its share: the seconds left less the stages after it and the report
        assert len(seen[name]) == 2 and all(0 < left < budget * 60 - clock.now for left in seen[name])


def _budget(cfg) -> float:
    """The minutes `cfg`'s plan takes at RATES with its data stage reused, and its overhead (the report's timing), a
    second more."""
    plan = plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev))
    rows = costs.Rows(3000, 50, 1000, test=872)  # as the run counts them (SST-2 dev.tsv the test split)
    return (est.total_seconds([*est.estimate(cfg, plan.stages, rows, RATES, {"data"}),
                               *tb.overhead_estimates(cfg, plan, rows, RATES)]) + 1) / 60


def test_a_plan_alone_is_printed_and_nothing_runs_or_is_written(tmp_path, sst2_dir):
    from recording_stages import RecordingStages

    rec, log = RecordingStages(), []
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "unlabeled_rows=50"])
    assert run_pipeline(cfg, log=log.append, functions=rec.functions(), measure=lambda c, r, w: RATES,
                        plan_only=True) is None
    assert log[0] == "plan, estimated on this machine (given):" and any(m.startswith("  teacher") for m in log)
    assert not any("running →" in m for m in log) and not rec.seen
    assert not (tmp_path / "r").exists()


def test_a_rerun_under_the_same_budget_keeps_the_cuts_the_last_run_made(tmp_path, sst2_dir, monkeypatch):
    """Rates measured again differ on a busy machine: another cut would run every stage again."""
    from recording_stages import RecordingStages

    clock = _Clock(monkeypatch)
    rates = [RATES]
    rec, log = RecordingStages(), []
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "unlabeled_rows=50",
                                            "augment.n_iter=8"])
    budget = _budget(replace(cfg, augment=replace(cfg.augment, n_iter=4)))
    cfg = replace(cfg, budget_minutes=budget)
    run_pipeline(cfg, log=log.append, functions=clock.timed(rec, cfg), measure=lambda c, r, w: rates[0])
    assert rec.seen["augment"][0].n_iter == 4
    log.clear()
    rates[0] = replace(RATES, teacher_step_s=0.5)  # faster now: a fresh fit would cut less
    run_pipeline(cfg, log=log.append, functions=clock.timed(rec, cfg), measure=lambda c, r, w: rates[0])
    assert not any("running →" in m for m in log) and "cut to fit budget_minutes: augment.n_iter 8 → 4" in log


def test_a_stage_may_take_minutes_from_the_cuts_after_it_worth_fewer_points_than_its_last_step(tmp_path, sst2_dir,
                                                                                               monkeypatch):
    """A teacher slower than planned keeps its second epoch (3.7 points) by the seconds the students' later epochs and
    the variants (worth less) would give; a stage with nothing cheaper after it gets what the plan leaves."""
    monkeypatch.setattr(tb, "clock", lambda: 0.0)
    cfg, stages = demo(tmp_path, sst2_dir, "teacher.epochs=2", "augment.n_iter=16")
    budget = tb.Budget(cfg, stages, ROWS, RATES, 30.0, 10_000.0, 0.0)
    assert budget.worth(cfg, "teacher") == 3.7
    cheap = replace(cfg, augment=replace(cfg.augment, n_iter=4),
                    students={n: replace(s, epochs=1) for n, s in cfg.students.items()})
    assert budget.share(cfg, {"data"}, "teacher") == 10_000.0 - 30.0 - total(cheap, stages, {"data", "teacher"})
    assert total(cheap, stages, {"data", "teacher"}) < total(cfg, stages, {"data", "teacher"}) - 100
    # the teacher's fifth epoch (0.37 points) takes only the variants (0.3 a halving) and students' epochs after
    # their fourth (1/6, 1/5, 1/4 and 1/3 points)
    cfg, stages = demo(tmp_path, sst2_dir, "augment.n_iter=16")
    cheap = replace(cfg, augment=replace(cfg.augment, n_iter=4),
                    students={n: replace(s, epochs=min(s.epochs, 4)) for n, s in cfg.students.items()})
    assert tb.Budget(cfg, stages, ROWS, RATES, 30.0, 10_000.0, 0.0).share(cfg, {"data"}, "teacher") == \
        10_000.0 - 30.0 - total(cheap, stages, {"data", "teacher"})
    # a student: the other student's epochs are its own lever, nothing after it is cut
    done = {"data", "teacher", "augment", "score", "students.labels_only"}
    assert budget.worth(cfg, "students.distilled") > 0
    assert tb.Budget(cfg, stages, ROWS, RATES, 30.0, 10_000.0, 0.0).share(cfg, done, "students.distilled") == \
        10_000.0 - 30.0 - total(cfg, stages, done | {"students.distilled"})


@pytest.mark.parametrize("over, kept", [(0.3, 3), (0.7, 2)])
def test_a_refit_keeps_a_trainers_epoch_of_which_at_least_half_fits(tmp_path, sst2_dir, over, kept):
    """Under the deadline a trainer's last epoch trains on the part of one the time left holds (recipe.py), so a
    re-fitted plan keeps an epoch of which MIN_PART fits (`part`); a plan fitted whole (part 0) takes none over."""
    cfg, stages = demo(tmp_path, sst2_dir, "students.distilled.epochs=3", "students.labels_only.epochs=3")
    done = {s.name for s in stages if s.name in ("data", "teacher", "augment", "score", "dev", "dev.score")}
    two = replace(cfg, students={n: replace(s, epochs=2) for n, s in cfg.students.items()})
    three_s, two_s = total(cfg, stages, done), total(two, stages, done)
    budget = (three_s - over * (three_s - two_s)) / 60  # `over` of the students' third epoch past the budget
    epochs = lambda c: {n: s.epochs for n, s in c.students.items()}  # noqa: E731
    assert epochs(tb.fit(cfg, stages, ROWS, RATES, done, budget, strict=False)[0]) == epochs(two)
    cut, cuts = tb.fit(cfg, stages, ROWS, RATES, done, budget, strict=False, part=tb.deadline.MIN_PART)
    assert epochs(cut) == {"labels_only": kept, "distilled": kept} and (cuts == []) == (kept == 3)
    # the trainers' epochs are cut in part under the deadline; the variants and the rows are given back only whole
    whole = {lv.name: lv.epochs for lv in tb.levers(cfg, stages, ROWS)}
    assert whole["students' epochs"] and whole["teacher.epochs"] and not whole["augment.n_iter"]
    assert not whole["unlabeled rows"]
