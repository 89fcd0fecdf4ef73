"""The search's part of the report (RUN/search/search.json, transferset/app/stages/search.py): each candidate's
latency and size against the budget, its selection accuracy at each rung, and why it stopped."""
from __future__ import annotations

import html
from typing import Any

from transferset.data.card import budget_text

HEADER = ("candidate", "CPU ms/example (batch 1, untrained; with exits, then as trained by rung)", "MB", "selection accuracy by rung", "stopped")


def _budget(doc: dict[str, Any]) -> str:
    return budget_text(doc["budget"])


def _timed_on(doc: dict[str, Any]) -> str:
    return ({"onnx": ", each candidate's ONNX export timed on ONNX Runtime", "pytorch": ""}.get(doc.get("runtime"), "")
            + (", and its int8 export (NAME+int8)" if doc.get("int8") else "")
            + (", and a transformer with early exits (NAME+exits@S, in PyTorch, untrained: every row leaving at the "
               "first branch)" if any("speed" in c for c in doc["candidates"].values()) else ""))


def _rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, c in doc["candidates"].items():
        accuracies = ", ".join(f"{rung}: {'-' if a is None else f'{100 * a:.1f}'}"
                               for rung, a in (c.get("selection_accuracy") or {}).items())
        trained = "".join(f"; {rung}: {t['latency_1']:.3g}" for rung, t in (c.get("trained") or {}).items())
        timed = [f"{c['latency_1']:.3g}{trained}", f"{c['mb']:.3g}"] if "latency_1" in c else ["-", "-"]
        rows.append([name, *timed, accuracies or "-", c.get("stopped", "")])
    return rows


def search_markdown(doc: dict[str, Any]) -> str:
    """results.md's search section."""
    lines = ["", "", f"Search: budget {_budget(doc)}{_timed_on(doc)}; chosen: {doc['chosen']} (the row "
             "`student: search`).", "",
             "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _rows(doc)]
    return "\n".join(lines)


def search_html(doc: dict[str, Any]) -> list[str]:
    """report.html's search section."""
    trs = ["<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in _rows(doc)]
    return [f"<h2>Search</h2><p>Budget: {html.escape(_budget(doc) + _timed_on(doc))}. Chosen: {html.escape(doc['chosen'])}, the "
            "row <i>student: search</i> above; the selection split chose it, the test split did not.</p>",
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in HEADER) + "</tr>" + "".join(trs) + "</table>"]
