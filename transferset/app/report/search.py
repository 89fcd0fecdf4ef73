"""The search's part of the report (RUN/search/search.json, transferset/app/stages/search.py): each candidate's
latency and size against the budget, its selection accuracy at each rung, and why it stopped."""
from __future__ import annotations

import html
import os
from typing import Any, Optional

from transferset.data.card import budget_text

HEADER = ("candidate", "CPU ms/example (batch 1, untrained; with exits, then as trained by rung)",
          "MB", "selection accuracy by rung", "stopped")


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


def search_html(doc: dict[str, Any], img: str = "") -> list[str]:
    """report.html's search section (`img`: the searched frontier's <img>)."""
    trs = ["<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in _rows(doc)]
    return [f"<h2>Search</h2><p>Budget: {html.escape(_budget(doc) + _timed_on(doc))}. Chosen: {html.escape(doc['chosen'])}, the "
            "row <i>student: search</i> above; the selection split chose it, the test split did not.</p>",
            *([img] if img else []),
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in HEADER) + "</tr>" + "".join(trs) + "</table>"]


def latency_at(entry: dict[str, Any], rung: str) -> float:
    """A variant's CPU ms at batch 1 after `rung`: an early-exit variant's as trained there (its untrained figure is
    a lower bound), any other's as timed untrained."""
    return (entry.get("trained") or {}).get(rung, {}).get("latency_1", entry["latency_1"])


def frontier_points(doc: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(variant, CPU ms at batch 1, selection accuracy in %) of every variant that trained: its accuracy at the last
    rung it reached, its latency as the search timed it (untrained; with exits, as trained at that rung)."""
    points = []
    for name, c in doc["candidates"].items():
        reached = [(rung, a) for rung, a in (c.get("selection_accuracy") or {}).items() if a is not None]
        if reached and "latency_1" in c:
            rung, accuracy = reached[-1]
            points.append((name, latency_at(c, rung), 100 * accuracy))
    return points


def budget_line(doc: dict[str, Any]) -> Optional[float]:
    """The budget in ms at batch 1 (budget_ms, or the teacher's latency over budget_speedup; the tighter), None when
    the budget is a size alone."""
    b = doc["budget"]
    teacher = next((c["teacher_ms"] for c in doc["candidates"].values() if c.get("teacher_ms")), None)
    lines = [v for v in (b.get("budget_ms"), teacher / b["budget_speedup"] if teacher and b.get("budget_speedup")
                         else None) if v is not None]
    return min(lines) if lines else None


def search_plot(doc: dict[str, Any], out_dir: str, plt) -> Optional[str]:
    """The searched frontier: each trained variant's selection accuracy against its CPU ms at batch 1, the budget
    line and the chosen point → the plot's path (None: nothing trained)."""
    points = frontier_points(doc)
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ms, accuracy in points:
        chosen = name == doc["chosen"]
        ax.scatter(ms, accuracy, color="tab:red" if chosen else "tab:blue", marker="*" if chosen else "o",
                   s=120 if chosen else 30, zorder=3)
        ax.annotate(name, (ms, accuracy), fontsize=7, xytext=(4, 3), textcoords="offset points")
    line = budget_line(doc)
    if line is not None:
        ax.axvline(line, color="tab:gray", linestyle="--", label=f"budget: {line:.3g} ms")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("CPU ms per example at batch 1, 1 thread, as the search timed it (log scale)")
    ax.set_ylabel("selection accuracy at the last rung reached (%)")
    ax.set_title(f"searched students, budget {_budget(doc)}; chosen: {doc['chosen']}")
    fig.tight_layout()
    path = os.path.join(out_dir, "search.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
