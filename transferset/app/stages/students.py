"""The students' stages: each trained here from the scored set (streamed from run_dir), saved locally, then
uploaded."""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Optional, Sequence

from students import families
from students.losses import LossWeights
from students.phases import phases
from transferset.app.report import student_rows
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, set_fingerprint
from transferset.app.stages.costs import Estimate, Lever, Rates, Rows, epoch_loss
from transferset.config import RunConfig
from transferset.app.stages.keys import KeyRules
from transferset.app.stages.layer_texts import students_reading_rest
from transferset.config import LAYER_TEXTS_REST


def student_settings(rules: KeyRules, s_cfg) -> dict:
    """A student stage's key settings (`rules.student`: transferset/app/stages/keys.py), with the content of the
    layer_texts set it reads (`rest`: the run's layer_texts stage, whose key is upstream)."""
    made = not s_cfg.layer_texts or s_cfg.layer_texts == LAYER_TEXTS_REST
    # keyed as it trains: the engine its family decides is held at its value (keys.py holds every setting so)
    return rules.student(families.settled(s_cfg), None if made else set_fingerprint(s_cfg.layer_texts))


def student_estimate(name: str, s_cfg, transfer: int, rows: Rows, rates: Rates, key: Optional[str] = None) -> Estimate:
    """Each phase's rows (the labeled ones alone for a phase on gold labels only) × its epochs, at most; `key`: the
    student's rates (None: the stage's name after `students.`)."""
    plan = phases(s_cfg.phases, LossWeights.of(s_cfg), s_cfg.epochs, layer_epochs=s_cfg.layer_epochs)
    seen = sum((rows.labeled if p.labeled_only else transfer) * p.epochs for p in plan)
    epochs = sum(p.epochs for p in plan)
    text = f"{seen // max(1, epochs):,} rows × {epochs} epochs = {seen:,}"
    key = key or name.split(".", 1)[1]
    step = rates.student_step_s.get(key)
    if step is None:
        return Estimate(name, text + " (not calibrated)", None)
    steps = sum(math.ceil((rows.labeled if p.labeled_only else transfer) / s_cfg.batch_size) * p.epochs
                for p in plan)
    # each epoch ends with the selection split's forward passes (about a third of a training step per batch); a
    # vocabulary made from the transfer set reads it once first
    evaluation = epochs * math.ceil(rows.selection / s_cfg.batch_size) * step / 3
    vocabulary = transfer / rates.tokenize_rows_s if rates.tokenize_rows_s and (
        s_cfg.vocab.trim_vocab or s_cfg.vocab.tokens == "words") else 0.0
    return Estimate(name, text, rates.student_fixed_s.get(key, 0.0) + vocabulary + vectors_seconds(s_cfg, transfer, rates)
                    + steps * step + evaluation)


def vectors_seconds(s_cfg, transfer: int, rates: Rates) -> float:
    """`embed_init: contextual` reads the transfer set's first texts through the teacher before the student trains:
    as many rows at the teacher's scoring rate."""
    if s_cfg.vocab.embed_init != "contextual" or not rates.score_rows_s:
        return 0.0
    from students.data.vectors import CONTEXT_TEXTS

    return min(transfer, CONTEXT_TEXTS) / rates.score_rows_s


def with_run_teacher(s_cfg, out: RunOutputs):
    """A student naming no teacher gets the run's one teacher (the scored set records where its teacher was, which
    a run folder moved or copied elsewhere no longer holds); an ensemble's students keep the set's record."""
    if s_cfg.teacher is not None or out.members:
        return s_cfg
    return replace(s_cfg, teacher=out.teacher)


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    """One stage per student; the keys keep the settings as written (the run's teacher is given when it runs)."""
    rest = students_reading_rest(r)

    def one(name: str, s_cfg) -> StageDef:
        run_cfg = with_run_teacher(replace(s_cfg, layer_texts=r.path("layer_texts")) if name in rest else s_cfg, out)
        return StageDef(f"students.{name}", out.students[name], functools.partial(student_settings, r.rules, s_cfg),
                        ("score", "dev.score", *(("layer_texts",) if name in rest else ())),
                        run=lambda work: r.fn.student(run_cfg, out.scored, out.dev_scored, work, overwrite=True),
                        local=True, kind="student",
                        estimate=lambda c: student_estimate(f"students.{name}", c.cfg.students[name], c.transfer,
                                                            c.rows, c.rates))

    out.students.update({name: r.path("students", name) for name in r.cfg.students})
    stages = [one(name, s_cfg) for name, s_cfg in r.cfg.students.items()]
    out.model_stages.extend(s.name for s in stages)
    return stages


# A student epoch fewer (every student's at once), in points of the distilled student's selection accuracy: its second
# epoch bought +3.1 and the next three +1.0 together on the sst2 proxy (benchmarks/levers.py)
EPOCH_LOSS = epoch_loss(3.1, 1.0)


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The students' epochs, cut together: none trains more than the value (each keeps its own when fewer)."""
    given = {n: s.epochs for n, s in cfg.students.items()}
    epochs = max(given.values(), default=1)

    def student_epochs(c: RunConfig, e: Optional[int]) -> RunConfig:
        return replace(c, students={n: replace(s, epochs=given[n] if e is None else min(given[n], e))
                                    for n, s in c.students.items()})

    names = tuple(s.name for s in stages if s.name.startswith("students."))
    return [Lever("students' epochs", epochs, list(range(epochs - 1, 0, -1)), student_epochs, names, EPOCH_LOSS,
                  epochs=True)]


def measures(cfg: RunConfig, will_run: set[str]) -> dict:
    """The step of each student that trains, by its name."""
    names = [n.split(".", 1)[1] for n in will_run if n.startswith("students.")]
    return {"students": {name: cfg.students[name] for name in names}} if names else {}


KIND = register(StageKind("students", build, after=("layer_texts",), levers=levers, measures=measures,
                          report_rows=student_rows))
