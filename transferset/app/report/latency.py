"""The latency of a run's models, as the report and the search take it: every model timed together on one thread
(transferset.runtime.timing), each on the path a user ships it on.

- A student: its saved model in PyTorch, or its export on ONNX Runtime.
- A teacher (a fine-tuned Hugging Face classifier): the forward pass that scores the transfer set
  (transferset.teacher.scoring.Teacher), padding-free on CPU for the families packed.py serves. Timed through the
  model's own padded forward, a batch of 64 is padded to its longest row, so on rows of mixed length the teacher
  was slower per example at batch 64 than at batch 1 (benchmarks/teacher_latency.py measures both paths).
- A teacher with early exits, timed at a speed: its own forward with the exits (students/families/exits.py).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional, Sequence

import numpy as np

from students.student import OnnxStudent, Student
from transferset import fs
from transferset.config import DEFAULT_MAX_LENGTH, ReportConfig
from transferset.contract import schema
from transferset.data import card
from transferset.fs.remote import local_teacher
from transferset.runtime import timing
from transferset.runtime.threads import torch_threads
from transferset.teacher.scoring import Teacher

REPORT_ROUNDS = ReportConfig().latency_rounds  # interleaved latency rounds at report time (transferset.runtime.timing)
# What a row's model ran on when timed.
PYTORCH, ONNX_RUNTIME, PACKED = "PyTorch", "ONNX Runtime", "PyTorch, padding-free"


class ScoringTeacher:
    """A teacher timed on its scoring path: `logits(texts)` as a student's, tokenization included."""

    def __init__(self, path: str):
        self.teacher = Teacher.load(path, num_threads=None, device="cpu", max_length=DEFAULT_MAX_LENGTH)
        self.runtime = PACKED if self.teacher.forward_path == "packed" else PYTORCH

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        return self.teacher.predict(list(texts)).logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.teacher.model.parameters())


def on_scoring_path(name: str, path: str, speeds: dict) -> bool:
    """Whether a model is a plain fine-tuned teacher (no exits, no export), timed on its scoring path."""
    return (name.startswith("teacher") and name not in speeds and card.kind_of(path) == card.TEACHER
            and not fs.exists(fs.join(path, schema.EXITS_FILE)))


def load_timed(path: str, how: str) -> Any:
    """The model at `path` ready to time: `how` is scoring (a teacher on its scoring path), teacher (a teacher's
    export or exits, at the teacher's tokens per row) or student."""
    path = local_teacher(path) if fs.is_remote(path) else path
    if how == "scoring":
        return ScoringTeacher(path)
    return Student.from_pretrained(path, max_length=DEFAULT_MAX_LENGTH if how == "teacher" else None)


def runtime_of(m: Any) -> str:
    return ONNX_RUNTIME if isinstance(m, OnnxStudent) else getattr(m, "runtime", PYTORCH)


def model_latency(models: dict[str, str], texts: Sequence[str], rounds: int = REPORT_ROUNDS,
                  speeds: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """{"models": {name: {parameters, latency_1, latency_64, spread_1, spread_64, runtime}}, "conditions": ...} for
    model directories (the teacher, students).

    One measurement over all of them (transferset.runtime.timing.measure): CPU ms per example at batch 1 and 64,
    tokenization included, on one thread, the median of `rounds` rounds in which every model is timed in
    turn, so a busy spell of the machine falls on all alike; "conditions" holds the load it was taken
    under and whether the machine was busy. The teacher truncates at DEFAULT_MAX_LENGTH, each student at
    its own training max_length.
    """
    speeds = speeds or {}
    with torch_threads(timing.THREADS):  # loaded inside too: an ONNX session takes its threads when made
        once: dict[tuple[str, str], Any] = {}  # one model with exits is timed at several speeds: loaded once
        loaded = {}
        for name, path in models.items():
            how = ("scoring" if on_scoring_path(name, path, speeds) else
                   "teacher" if name.startswith("teacher") else "student")
            if (path, how) not in once:
                once[(path, how)] = load_timed(path, how)
            loaded[name] = once[(path, how)]
        calls = {name: (partial(m.logits, speed=m.check_speed(speeds[name])) if name in speeds else m.logits)
                 for name, m in loaded.items()}
        timed = timing.measure(calls, texts, batch_sizes=(1, 64), rounds=rounds)
    out = {}
    for name, m in loaded.items():
        cells = timed["latency"][name]
        out[name] = {"parameters": m.num_parameters(),
                     "latency_1": cells["batch_1"]["median"], "latency_64": cells["batch_64"]["median"],
                     "spread_1": [cells["batch_1"]["q1"], cells["batch_1"]["q3"]],
                     "spread_64": [cells["batch_64"]["q1"], cells["batch_64"]["q3"]],
                     "runtime": runtime_of(m)}
    return {"models": out, "conditions": timed["conditions"]}


def latency_note(cond: dict, rounds: int = REPORT_ROUNDS, rows: Sequence[dict] = ()) -> str:
    """The sentence under the results table: how the latency was taken, on which runtime, and what a busy
    machine means."""
    note = (f"Latency: CPU ms per example, tokenization included, every model timed together in {rounds} "
            f"interleaved rounds (the median); {timing.describe(cond)}.")
    packed = [r["name"] for r in rows if r.get("runtime") == PACKED]
    if packed:
        note += (f" {', '.join(packed)}: the forward pass that scored the transfer set, padding-free (a batch is "
                 "not padded to its longest row).")
    onnx = [r.get("display", r["name"]) for r in rows if r.get("runtime") == ONNX_RUNTIME]
    if onnx:
        note += (f" {', '.join(onnx)}: ONNX Runtime (an export), every other model PyTorch, so their speed-ups "
                 "include ONNX Runtime's own over PyTorch (`python benchmarks/int8.py RUN_DIR` times every "
                 "model on ONNX Runtime); an export computes a batch padded to its longest row, so on rows of mixed "
                 "length its batch-64 time per example can exceed its batch-1 time.")
    if cond.get("busy"):
        note += (" The speed-ups are left out: time the models again on a quiet machine "
                 "(`python benchmarks/latency.py RUN_DIR`).")
    return note
