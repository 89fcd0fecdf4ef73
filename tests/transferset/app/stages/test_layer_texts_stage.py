"""The layer_texts stage: made only when a student reads `rest`, and read by that student alone."""
from stage_plans import plan_of, stages  # noqa: F401 (a fixture)


def test_made_only_when_a_student_asks(plan_of):
    assert stages(plan_of(), "layer_texts") == {}
    plan = plan_of("students.distilled.layer_texts=rest")
    assert stages(plan, "layer_texts") == {"layer_texts": ("layer_texts", ("data",))}
    students = stages(plan, "students.")
    assert students["students.distilled"][1] == ("score", "dev.score", "layer_texts")
    assert students["students.labels_only"][1] == ("score", "dev.score")
