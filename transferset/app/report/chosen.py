"""RUN/chosen: the one model a run ships, and the line that says which (the report's first line).

A run trains several models; a user wants one answer. The chosen model is the most accurate on the selection
split (the split every choice is made on; the test split chooses nothing) among the run's models that meet its
latency target:
- a run that searched (`search:` or a budget flag): the search's choice, which met the budget already;
- otherwise at least `report.min_speedup` times the teacher's speed at batch 1 on one thread (the teacher on the
  forward pass that scored the transfer set, padding-free where it can), each model timed on its runtime in the
  report's interleaved rounds.
Of two alike on selection, the faster. Where no model meets the target, the line says so and the closest (the
fastest) is shipped, named as such. The chosen model's folder is copied to RUN/chosen, with RUN/chosen.json
saying what it is and why.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from students.losses import GOLD, canonical, get
from transferset import fs
from transferset.app.report.outputs import ResultRow

CHOSEN_DIR = "chosen"  # RUN/chosen: a copy of the chosen model's folder
CHOSEN_FILE = "chosen.json"  # RUN/chosen.json: which model, its figures and why


@dataclass(frozen=True)
class Choice:
    name: str  # its row in the results table
    path: str  # its folder
    meets: bool  # whether it meets the target
    target: str  # the target in words
    selection: Optional[float]
    test: Optional[float]
    speedup: Optional[float]  # teacher's ms / its ms at batch 1, one thread
    speedup_export: Optional[float]  # the same against the teacher's own ONNX export (None: the run has none)
    runtime: str
    # the labels-only student compared with (the best on selection), if the run had one and the chosen is not one
    labels_only: Optional[str]
    labels_only_test: Optional[float]
    busy: bool  # timed on a busy machine: the speed-ups are indicative only


def learned_from_labels_only(config: dict) -> bool:
    """Whether a student's settings (its metrics.json `config`) trained it on the gold labels alone: one joint phase
    on losses of the gold role only (students.losses.ROLES)."""
    losses = canonical(config.get("losses") or {})
    return config.get("phases") == "joint" and bool(losses) and all(get(n).role == GOLD for n in losses)


def speedup(row: ResultRow, teacher: ResultRow) -> Optional[float]:
    """teacher's / this model's ms per example at batch 1 (as timed in one set of interleaved rounds, busy or not)."""
    ms = row.get("latency_1")
    return teacher["latency_1"] / ms if ms else None


def _rank(row: ResultRow) -> tuple:
    return (row.get("dev_accuracy") or 0.0, -(row.get("latency_1") or float("inf")))


def choose(rows: Sequence[ResultRow], min_speedup: float) -> Optional[Choice]:
    """The chosen row among the report's results rows: those with a `path` can be shipped as they are; a row with
    `searched` is the search's choice; `labels_only` marks a student that learned from the gold labels alone."""
    teacher = next((r for r in rows if r["name"] == "teacher"), None)
    shippable = [r for r in rows if r.get("path")]
    if teacher is None or not shippable:
        return None
    busy = bool(teacher.get("latency_busy"))
    search = next((r for r in shippable if r.get("searched")), None)
    if search is not None:
        return _choice(search, teacher, True, "the search's budget", rows, busy)
    target = f"at least {min_speedup:g}x the teacher's speed at batch 1"
    meeting = [r for r in shippable if (speedup(r, teacher) or 0.0) >= min_speedup]
    if meeting:
        return _choice(max(meeting, key=_rank), teacher, True, target, rows, busy)
    closest = max(shippable, key=lambda r: (speedup(r, teacher) or 0.0, _rank(r)))
    return _choice(closest, teacher, False, target, rows, busy)


def _choice(row: ResultRow, teacher: ResultRow, meets: bool, target: str, rows: Sequence[ResultRow],
            busy: bool) -> Choice:
    plain = [r for r in rows if r.get("labels_only")]
    # the chosen model is a labels-only student (or its export): no gain over labels-only to state
    source = (row.get("compressed") or {}).get("from")
    itself = row.get("labels_only") or (source is not None and source in {r.get("student") for r in plain})
    best_plain = max(plain, key=_rank) if plain and not itself else None
    return Choice(name=row.get("display", row["name"]), path=row["path"], meets=meets, target=target,
                  selection=row.get("dev_accuracy"), test=row.get("test_accuracy"), speedup=speedup(row, teacher),
                  speedup_export=row.get("speedup_1_export"),
                  runtime=row.get("runtime", ""),
                  labels_only=best_plain and best_plain.get("display", best_plain["name"]),
                  labels_only_test=best_plain and best_plain.get("test_accuracy"), busy=busy)


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def line(c: Choice, where: str) -> str:
    """The report's first line: which model to ship, its test accuracy, its gain over labels-only, its speed-up."""
    parts = [f"test {_pct(c.test)}"]
    if c.labels_only is not None and c.test is not None and c.labels_only_test is not None:
        parts.append(f"{100 * (c.test - c.labels_only_test):+.1f} over labels-only ({_pct(c.labels_only_test)})")
    if c.speedup is not None:
        against = "" if c.speedup_export is None else f", {c.speedup_export:.1f}x the teacher's own ONNX export"
        parts.append(f"{c.speedup:.1f}x the teacher's speed at batch 1 on one thread{against} ({c.runtime}"
                     f"{', timed on a busy machine' if c.busy else ''})")
    head = f"Ship {c.name}" if c.meets else f"No model meets {c.target}; the closest is {c.name}"
    return f"{head}: {', '.join(parts)}; selection {_pct(c.selection)} (chosen on it) — in {where}"


def where(run_dir: str) -> str:
    return fs.join(run_dir, CHOSEN_DIR)


def ship(c: Choice, run_dir: str) -> None:
    """The chosen model's folder copied to RUN/chosen (what was there before replaced), with RUN/chosen.json: after
    the run's model cards have the report's figures, so the copy's card has them too."""
    target = where(run_dir)
    fs.delete(target)
    fs.copy_tree(c.path, target)
    fs.write_json(fs.join(run_dir, CHOSEN_FILE), {"chosen": asdict(c), "folder": target}, indent=2)
