"""The rates of the plan (transferset/app/planning/calibrate.py), measured on a tiny teacher: each kind of stage that runs
gets its rate, the others none, and the plan says what was measured."""
from __future__ import annotations

import pytest

from transferset.app.planning.calibrate import measure_rates
from transferset.app.stages.costs import Rows
from transferset.app.run.runner import load_config
from transferset.runtime.errors import UserError

TEXTS = tuple(f"the film was {'very ' * (i % 7)}good and not boring" for i in range(40))


def _cfg(tiny_teacher, *overrides):
    return load_config("configs/demo.yaml", [f"teacher.model={tiny_teacher}", "teacher.batch_size=8",
                                             "students.distilled.batch_size=8", "augment.ops=mask,ngram", *overrides])


def test_each_kind_that_runs_is_measured_and_said(tiny_teacher):
    rates = measure_rates(_cfg(tiny_teacher), Rows(100, 0, 10, sample=TEXTS),
                          {"teacher", "augment", "score", "students.distilled"})
    assert rates.teacher_step_s > 0 and rates.score_rows_s > 0 and rates.augment_rows_s > 0
    assert set(rates.student_step_s) == {"distilled"} and rates.student_step_s["distilled"] > 0
    assert rates.student_fixed_s["distilled"] > 0 and rates.tokenize_rows_s > 0 and rates.teacher_fixed_s > 0
    for said in ("teacher", "s/step of 8 rows", "scoring", "distilled", "augment", "measured in"):
        assert said in rates.measured


def test_what_is_reused_is_not_measured(tiny_teacher):
    rates = measure_rates(_cfg(tiny_teacher), Rows(100, 0, 10, sample=TEXTS), {"students.distilled"})
    assert rates.teacher_step_s is None and rates.augment_rows_s is None and set(rates.student_step_s) == {"distilled"}
    assert measure_rates(_cfg(tiny_teacher), Rows(100, 0, 10, sample=TEXTS), set()).measured == "nothing to measure"


def test_a_transformer_student_is_calibrated_from_the_teachers_step_and_a_search_each_candidate(tiny_teacher):
    cfg = _cfg(tiny_teacher, "students.distilled.student=transformer", "students.distilled.preset=null",
               "students.distilled.model={n_layer: 1}", "search.budget_ms=1",
               "search.space={narrow: {student: bilstm, model: {hidden: 8}}, cut: {student: transformer, "
               "model: {n_layer: 2}}}", "search.base={batch_size: 8, losses: {kd: 1.0}}")
    rates = measure_rates(cfg, Rows(100, 0, 10, sample=TEXTS), {"students.distilled", "search"})
    steps = rates.student_step_s
    assert set(steps) == {"distilled", "search.narrow", "search.cut"} and all(v > 0 for v in steps.values())
    # the tiny teacher has 2 layers: one of them costs half its step, both the whole step (the same batch size,
    # measured once)
    assert steps["distilled"] == steps["search.cut"] / 2
    assert "search.narrow" in rates.measured and rates.student_fixed_s["search.cut"] == 0.0


def test_a_student_with_a_sparse_table_is_timed_with_the_optimizer_it_trains_with(tiny_teacher):
    # built by its family's `shaped`, the table learning by lazy Adam (its sparse gradient clipped as training does)
    cfg = _cfg(tiny_teacher, "students.distilled.student=static", "students.distilled.preset=null",
               "students.distilled.vocab.freeze_embeddings=false", "students.distilled.model={hidden: 8, sparse: true}")
    rates = measure_rates(cfg, Rows(100, 0, 10, sample=TEXTS), {"students.distilled"})
    assert set(rates.student_step_s) == {"distilled"} and rates.student_step_s["distilled"] > 0
    fixed = _cfg(tiny_teacher, "students.distilled.student=static", "students.distilled.preset=null",
                 "students.distilled.model={hidden: 8, sparse: true}")
    with pytest.raises(UserError, match="model: {sparse: true} is for a word table that trains"):
        measure_rates(fixed, Rows(100, 0, 10, sample=TEXTS), {"students.distilled"})


def test_the_load_the_rates_were_measured_under_is_recorded(tiny_teacher, monkeypatch):
    import transferset.app.planning.calibrate as calibrate

    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (5.5, 5.0, 4.0))
    rates = measure_rates(_cfg(tiny_teacher), Rows(100, 0, 10, sample=TEXTS), set())
    assert rates.load == 5.5 and rates.cores == calibrate.machine_load()[1] >= 1


def test_a_bilstm_shape_that_does_not_exist_is_refused_at_the_plan(tiny_teacher):
    cfg = _cfg(tiny_teacher, "students.distilled.model.shape=tnag")
    with pytest.raises(UserError, match=r"unknown bilstm shape 'tnag' \(model: \{shape: NAME\}\); known: tang, "):
        measure_rates(cfg, Rows(100, 0, 10, sample=TEXTS), {"students.distilled"})
    # a preset that was a shape says what to write instead
    cfg = _cfg(tiny_teacher, "students.distilled.model={}", "students.distilled.preset=tang")
    with pytest.raises(UserError, match=r"`preset: tang` is a BiLSTM shape: write `model: \{shape: tang\}`"):
        measure_rates(cfg, Rows(100, 0, 10, sample=TEXTS), {"students.distilled"})


def test_scoring_at_bf16_is_timed_in_bf16_on_a_copy_and_the_students_on_fp32(tiny_teacher, monkeypatch):
    import torch

    from transferset.app.planning import calibrate
    from transferset.teacher import scoring

    seen = {}
    predict, step = scoring.Teacher.predict, calibrate.transformer_step

    def timed_predict(self, texts, texts_b=None):
        seen.setdefault("score", []).append((self.precision, next(self.model.parameters()).dtype))
        return predict(self, texts, texts_b)

    def timed_step(model, *args, **kwargs):
        seen["student"] = next(model.parameters()).dtype
        return step(model, *args, **kwargs)

    monkeypatch.setattr(scoring.Teacher, "predict", timed_predict)
    monkeypatch.setattr(calibrate, "transformer_step", timed_step)
    cfg = _cfg(tiny_teacher, "score.precision=bf16", "students.distilled.student=transformer",
               "students.distilled.preset=null", "students.distilled.model={n_layer: 1}")
    rates = measure_rates(cfg, Rows(100, 0, 10, sample=TEXTS), {"score", "students.distilled"})
    assert rates.score_rows_s > 0 and rates.student_step_s["distilled"] > 0
    # scoring timed in bf16; then the teacher at fp32, as the test stage and the report run it: its rate and a row on
    # one thread
    # one thread (each an untimed call first)
    assert seen["student"] == torch.float32 and rates.fp32_rows_s > 0 and rates.teacher_row_s > 0
    assert seen["score"] == [("bf16", torch.bfloat16)] * 2 + [("fp32", torch.float32)] * 4
