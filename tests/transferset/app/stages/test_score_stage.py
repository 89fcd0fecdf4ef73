"""The score stages: the transfer set and the selection split, scored by the teacher or the ensemble."""
from stage_plans import plan_of, stages  # noqa: F401 (a fixture)


def test_score_dev_and_dev_score_with_their_upstream(plan_of):
    plan = plan_of()
    assert stages(plan, "score") == {"score": ("scored", ("augment", "teacher"))}
    assert stages(plan, "dev") == {"dev": ("dev/transfer", ()), "dev.score": ("dev/scored", ("dev", "teacher"))}
    by = {s.name: s for s in plan.stages}
    assert by["dev.score"].kind == "score" and by["score"].resume is not None  # resumes by shard
    assert plan.outputs.scored.endswith("/r/scored") and plan.outputs.dev_scored.endswith("/r/dev/scored")


def test_the_combine_rule_is_in_the_key_only_with_an_ensemble(plan_of):
    one = {s.name: s for s in plan_of("score.combine=probs").stages}["score"]
    assert "combine" not in one.settings
    members = {s.name: s for s in plan_of("teacher_seeds=[0, 1]", "score.combine=probs").stages}["score"]
    assert members.settings["combine"] == "probs"
