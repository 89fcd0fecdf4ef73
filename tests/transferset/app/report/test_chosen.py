"""RUN/chosen: the most accurate model on selection among those meeting the target (transferset/app/report/chosen.py)."""
from transferset.app.report.chosen import choose, learned_from_labels_only, line


def _row(name, dev, ms, test=None, **extra):
    return {"name": name, "dev_accuracy": dev, "test_accuracy": test, "latency_1": ms, "runtime": "PyTorch",
            "path": f"/runs/r/{name}", **extra}


TEACHER = _row("teacher", 0.90, 10.0, test=0.89)


def test_the_most_accurate_on_selection_of_those_fast_enough_is_chosen_not_the_best_on_test():
    rows = [TEACHER, _row("a", 0.85, 0.5, test=0.80), _row("b", 0.84, 0.9, test=0.88),
            _row("slow", 0.89, 2.0, test=0.89), _row("plain", 0.80, 0.6, test=0.78, labels_only=True)]
    c = choose(rows, 10.0)
    assert (c.name, c.meets, c.speedup) == ("a", True, 20.0)  # "slow" is 5x, "b" is better on test only
    assert c.labels_only == "plain" and c.labels_only_test == 0.78
    text = line(c, "/runs/r/chosen")
    assert text.startswith("Ship a: test 80.0, +2.0 over labels-only (78.0), 20.0x the teacher's speed")
    assert text.endswith("selection 85.0 (chosen on it) — in /runs/r/chosen")


def test_of_two_alike_on_selection_the_faster_is_chosen():
    rows = [TEACHER, _row("a", 0.85, 0.8), _row("b", 0.85, 0.4)]
    assert choose(rows, 10.0).name == "b"


def test_when_nothing_meets_the_target_the_closest_is_named_and_said_to_miss_it():
    rows = [TEACHER, _row("a", 0.88, 2.0), _row("b", 0.80, 1.5), _row("member", 0.9, 0.1, path=None)]
    c = choose(rows, 10.0)
    assert (c.name, c.meets, c.speedup) == ("b", False, 10.0 / 1.5)
    assert line(c, "X").startswith("No model meets at least 10x the teacher's speed at batch 1; the closest is b: ")


def test_the_searchs_choice_is_the_runs_whatever_else_is_faster():
    rows = [TEACHER, _row("fast", 0.89, 0.1), _row("student: search (bilstm, joint)", 0.85, 1.0, searched=True)]
    c = choose(rows, 10.0)
    assert (c.name, c.meets, c.target) == ("student: search (bilstm, joint)", True, "the search's budget")


def test_a_lower_target_can_choose_the_teacher_itself():
    rows = [TEACHER, _row("a", 0.85, 0.5)]
    assert choose(rows, 1.0).name == "teacher" and choose(rows, 10.0).name == "a"


def test_labels_only_means_one_joint_phase_on_losses_that_read_no_teacher_column():
    assert learned_from_labels_only({"phases": "joint", "losses": {"ce": 1.0}})
    assert not learned_from_labels_only({"phases": "joint", "losses": {"ce": 1.0, "kd": 1.0}})
    assert not learned_from_labels_only({"phases": "joint", "losses": {"ce": 0.0, "kd": 1.0}})
    assert not learned_from_labels_only({"phases": "xtremedistil", "losses": {"ce": 1.0}})


def test_a_chosen_labels_only_student_or_its_export_states_no_gain_over_labels_only():
    rows = [TEACHER, _row("student: plain (bilstm, joint)", 0.86, 0.5, test=0.80, labels_only=True, student="plain"),
            _row("plain (ONNX)", 0.87, 0.3, test=0.81, compressed={"from": "plain", "how": "onnx"}),
            _row("student: kd (bilstm, joint)", 0.84, 0.5, test=0.79, student="kd")]
    c = choose(rows, 10.0)
    assert (c.name, c.labels_only) == ("plain (ONNX)", None)
    assert "over labels-only" not in line(c, "X")
