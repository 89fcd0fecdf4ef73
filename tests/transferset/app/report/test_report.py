"""transferset/app/report/__init__.py: what a person reads in the results table about the latency figures."""
from transferset.app.report import results_table
from transferset.runtime import timing

TEACHER = {"name": "teacher", "dev_accuracy": 0.9, "test_accuracy": 0.88, "agreement": None, "parameters": 22_000_000,
           "latency_1": 12.5, "latency_64": 1.25}
STUDENT = {"name": "student: s (bilstm, joint)", "dev_accuracy": 0.85, "test_accuracy": 0.84, "agreement": 0.9,
           "parameters": 1_000_000, "latency_1": 1.0, "latency_64": 0.1}


def _conditions(load: float, share: float) -> dict:
    return timing.conditions(threads=1, cpu_count=2, load_before=[load] * 3, load_after=[load] * 3, cpu_share=share)


def test_a_quiet_machine_gives_figures_and_speed_ups_with_their_conditions():
    cond = _conditions(0.5, 0.99)
    table = results_table([TEACHER, {**STUDENT, "speedup_1": 12.5, "speedup_64": 12.5}], cond)
    assert "| 1.00 | 0.100 | 12.5× / 12.5× |" in table and "busy" not in table
    assert table.splitlines()[-1] == ("Latency: CPU ms per example, tokenization included, every model timed together "
                                      "in 5 interleaved rounds (the median); 1 thread, load average 0.50 on 2 CPUs, "
                                      "99% of a core for the timed thread.")


def test_a_busy_machine_is_said_beside_the_figures_and_the_speed_ups_are_left_out():
    """On a busy machine (a parallel job can put the teacher at 247 ms/example and shrink 12-18x speed-ups to
    1.4-4.3x) every figure is marked busy, the speed-ups are left out and the note says why."""
    cond = _conditions(7.3, 0.4)
    rows = [{**TEACHER, "latency_busy": True},
            {**STUDENT, "latency_busy": True, "speedup_1": None, "speedup_64": None}]
    table = results_table(rows, cond)
    assert "| 12.50 (busy) | 1.250 (busy) | 1.0× / 1.0× |" in table
    assert "| 1.00 (busy) | 0.100 (busy) | - (busy machine) |" in table and "12.5×" not in table
    note = table.splitlines()[-1]
    assert "the machine was busy (load average 7.30 on 2 CPUs; the timed thread got 40% of a core)" in note
    assert "The speed-ups are left out" in note and "benchmarks/latency.py" in note


def test_the_note_says_which_rows_ran_on_onnx_runtime():
    """The report times an int8 model as its ONNX export and the rest in PyTorch: the speed-ups of the
    former hold ONNX Runtime's own, which the note says."""
    cond = _conditions(0.5, 0.99)
    int8 = {**STUDENT, "name": "distilled (int8)", "runtime": "ONNX Runtime", "speedup_1": 30.0, "speedup_64": 30.0}
    rows = [{**TEACHER, "runtime": "PyTorch"}, {**STUDENT, "runtime": "PyTorch"}, int8]
    note = results_table(rows, cond).splitlines()[-1]
    assert note.endswith("distilled (int8): ONNX Runtime (an export), every other model PyTorch, so their speed-ups "
                         "include ONNX Runtime's own over PyTorch (`python benchmarks/int8.py RUN_DIR` times every "
                         "model on ONNX Runtime); an export computes a batch padded to its longest row, so on rows "
                         "of mixed length its batch-64 time per example can exceed its batch-1 time.")
    assert "ONNX Runtime" not in results_table(rows[:2], cond).splitlines()[-1]


def test_a_models_name_is_plain_text_in_results_md_and_report_html(tmp_path):
    """A student's name is a YAML key: `<script>`, a `javascript:` link, a newline or a `|` in it is shown as
    text in results.md (one row, its cells whole) and in report.html, never run, linked or split."""
    from transferset.app.report import _html

    name = "student: <script>alert(1)</script> [x](javascript:alert(1)) a|b\nc (bilstm, joint)"
    table = results_table([TEACHER, {**STUDENT, "name": name}])
    row = table.splitlines()[-1]
    assert len(table.splitlines()) == 4 and row.startswith(
        "| student: &lt;script&gt;alert(1)&lt;/script&gt; \\[x\\](javascript:alert(1)) a\\|b c (bilstm, joint) | 85.0")
    assert len(row.replace("\\|", "").split("|")) == len(table.splitlines()[0].split("|"))
    page = _html(table_rows=[{**STUDENT, "name": name}], aug={"mean_variants_per_example": 1.0, "plot": "a.png"},
                 conf={"plot": "c.png"}, curves=[], stats={}, run_dir=str(tmp_path), dev="dev.tsv")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
