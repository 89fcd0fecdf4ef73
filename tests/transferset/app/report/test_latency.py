"""How the report and the search time a model (transferset/app/report/latency.py): a teacher on the forward pass that
scored the transfer set, padding-free where packed.py serves its family, not its own padded forward."""
import numpy as np

from students.student import Student
from tolerances import tiny_bert
from transferset.app.report.latency import PACKED, PYTORCH, ScoringTeacher, latency_note, model_latency, on_scoring_path

TEXTS = [f"the film was {'very ' * (i % 9)}good{' and not boring at all' * (i % 3)}" for i in range(64)]


def test_the_teacher_is_timed_on_its_scoring_path_which_computes_the_same_logits(tiny_teacher):
    timed = ScoringTeacher(tiny_teacher)
    assert timed.runtime == PACKED and timed.teacher.max_length == 128
    want = Student.from_pretrained(tiny_teacher, max_length=128).logits(TEXTS)
    np.testing.assert_allclose(timed.logits(TEXTS), want, rtol=0, atol=tiny_bert(want))
    assert timed.num_parameters() == Student.from_pretrained(tiny_teacher).num_parameters()
    row = model_latency({"teacher": tiny_teacher}, TEXTS[:8], rounds=1)["models"]["teacher"]
    assert row["runtime"] == PACKED and row["parameters"] == timed.num_parameters()


def test_only_a_plain_teacher_named_teacher_takes_the_scoring_path(tiny_teacher, tmp_path):
    assert on_scoring_path("teacher", tiny_teacher, {})
    assert not on_scoring_path("teacher (exits, speed 0.5)", tiny_teacher, {"teacher (exits, speed 0.5)": 0.5})
    assert not on_scoring_path("student:copy", tiny_teacher, {})  # a classifier used as a student: as students are
    assert not on_scoring_path("teacher", str(tmp_path), {})  # no model there


def test_the_note_names_the_rows_timed_padding_free():
    cond = {"threads": 1, "cpu_count": 2, "load_average_after": [0.5, 0.5, 0.5], "cpu_share": 0.99, "busy": False}
    rows = [{"name": "teacher", "runtime": PACKED}, {"name": "student: a (bilstm, joint)", "runtime": PYTORCH}]
    note = latency_note(cond, 5, rows)
    assert " teacher: the forward pass that scored the transfer set, padding-free (a batch is not padded to its " \
           "longest row)." in note
    assert "padding-free" not in latency_note(cond, 5, rows[1:])
