"""The students' stages: each trained here from the scored set (streamed from run_dir), saved locally, then
uploaded."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from students import families
from transferset.app.stages.base import RunOutputs, StageDef, StageKind, register
from transferset.app.stages.context import Run, set_fingerprint
from transferset.app.stages.layer_texts import students_reading_rest
from transferset.config import LAYER_TEXTS_REST


def student_settings(rules: Any, s_cfg) -> dict:
    """A student stage's key settings (`rules.student`: transferset/app/keys.py), with the content of the
    layer_texts set it reads (`rest`: the run's layer_texts stage, whose key is upstream)."""
    made = not s_cfg.layer_texts or s_cfg.layer_texts == LAYER_TEXTS_REST
    # keyed as it trains: the engine its family decides is held at its value (keys.py holds every setting so)
    return rules.student(families.settled(s_cfg), None if made else set_fingerprint(s_cfg.layer_texts))


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
                        local=True, kind="student")

    out.students.update({name: r.path("students", name) for name in r.cfg.students})
    stages = [one(name, s_cfg) for name, s_cfg in r.cfg.students.items()]
    out.model_stages.extend(s.name for s in stages)
    return stages


KIND = register(StageKind("students", build, after=("layer_texts",)))
