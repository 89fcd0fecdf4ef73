"""The teacher stage: trained in the run, given by its folder, or an ensemble's members and the stage that
stands for them."""
from dataclasses import replace

from stage_plans import plan_of, stages  # noqa: F401 (a fixture)
from transferset import testing


def test_a_trained_teacher_is_one_stage_after_the_data(plan_of):
    plan = plan_of()
    assert stages(plan, "teacher") == {"teacher": ("teacher", ("data",))}
    assert plan.outputs.teacher.endswith("/r/teacher") and plan.outputs.members == []
    assert plan.outputs.scorer == plan.outputs.teacher


def test_seeds_make_members_and_a_stage_standing_for_them(plan_of):
    plan = plan_of("teacher_seeds=[0, 1]", "score.combine=probs")
    assert stages(plan, "teacher") == {"teacher.seed0": ("teachers/seed0", ("data",)),
                                       "teacher.seed1": ("teachers/seed1", ("data",)),
                                       "teacher": (None, ("teacher.seed0", "teacher.seed1"))}
    out = plan.outputs
    assert out.ensemble and out.scorer == out.members and out.combine == "probs"
    # the members share a kind: a member's key is the single teacher's with its seed
    assert {s.kind for s in plan.stages if s.name.startswith("teacher.")} == {"teacher"}


def test_a_given_teacher_is_keyed_by_its_weights(plan_of, tmp_path):
    given = testing.tiny_classifier(str(tmp_path / "given"))
    plan = plan_of(f"teacher_path={given}")
    teacher = {s.name: s for s in plan.stages}["teacher"]
    assert teacher.run is None and plan.outputs.teacher == given
    before = teacher.key([])
    (tmp_path / "given" / "model.safetensors").write_bytes(b"other weights")
    assert replace(teacher).key([]) == before  # settings are resolved when the plan is built
    assert plan_of(f"teacher_path={given}").stages[1].key([]) != before
