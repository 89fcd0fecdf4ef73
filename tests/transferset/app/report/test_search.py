"""The search's section of results.md and report.html, from a search.json."""
from transferset.app.report.search import search_html, search_markdown

DOC = {"budget": {"budget_ms": 1.0, "budget_mb": None, "budget_speedup": 50.0}, "chosen": "bilstm-150",
       "candidates": {
           "bilstm-150": {"latency_1": 0.41, "mb": 36.9, "selection_accuracy": {"1 epochs": 0.801, "4 epochs": 0.83},
                          "stopped": "chosen: the best selection accuracy of the last rung"},
           "static": {"latency_1": 0.12, "mb": 36.0, "selection_accuracy": {"1 epochs": 0.74},
                      "stopped": "rung 1 (1 epochs): not among the best 1 of 2"},
           "a|b<i>": {"latency_1": 2.5, "mb": 90.0, "stopped": "over budget: 2.5 ms > 1 ms"}}}


def test_the_markdown_section_names_the_budget_and_each_candidates_end():
    md = search_markdown(DOC).splitlines()
    assert md[:2] == ["", ""] and md[2] == "Search: budget 1 ms per example, 50x the teacher's speed; chosen: bilstm-150 (the row " \
                    "`student: search`)."
    assert md[6] == "| bilstm-150 | 0.41 | 36.9 | 1 epochs: 80.1, 4 epochs: 83.0 | chosen: the best selection " \
                    "accuracy of the last rung |"
    assert md[8] == "| a\\|b<i> | 2.5 | 90 | - | over budget: 2.5 ms > 1 ms |"  # a pipe cannot split the row


def test_the_html_section_escapes_names():
    page = "".join(search_html(DOC))
    assert "<td>a|b&lt;i&gt;</td>" in page and "<i>student: search</i>" in page and "Chosen: bilstm-150" in page
