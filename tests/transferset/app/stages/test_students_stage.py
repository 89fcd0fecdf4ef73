"""The students' stages: one per student, keyed as "student", each given the run's one teacher."""
from dataclasses import replace

from stage_plans import plan_of, stages  # noqa: F401 (a fixture)
from transferset.app.stages.context import StageFunctions


def test_one_stage_per_student_after_both_scored_sets(plan_of):
    plan = plan_of()
    assert stages(plan, "students.") == {"students.labels_only": ("students/labels_only", ("score", "dev.score")),
                                         "students.distilled": ("students/distilled", ("score", "dev.score"))}
    assert {s.kind for s in plan.stages if s.name.startswith("students.")} == {"student"}
    assert plan.outputs.model_stages[1:3] == ["students.labels_only", "students.distilled"]


def test_a_student_naming_no_teacher_gets_the_runs_and_its_key_keeps_the_setting_as_written(plan_of):
    plan = plan_of()
    got = {}
    student = {s.name: s for s in plan.stages}["students.distilled"]
    fn = replace(StageFunctions(), student=lambda cfg, scored, dev, out, **kw: got.update(
        teacher=cfg.teacher, scored=scored, dev=dev))
    # the stage's run closure reads the functions of the run it was planned with: plan again with the recorder
    from transferset.app.stages.plan import build_plan
    from transferset.app.run.runner import load_config, resolve_data
    cfg = load_config("configs/demo.yaml", [f"run_dir={plan.outputs.run_dir}", "data=../shared/data/sst2"])
    again = {s.name: s for s in build_plan(cfg, resolve_data(cfg.data), fn).stages}["students.distilled"]
    again.run("WORK")
    assert got == {"teacher": plan.outputs.teacher, "scored": plan.outputs.scored, "dev": plan.outputs.dev_scored}
    assert student.settings()["teacher"] is None
