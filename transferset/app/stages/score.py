"""The score stages: the transfer set scored by the teacher (or an ensemble's members), and the selection split
as a set scored the same way (students stop early on it and report their agreement with the teacher on rows
they never trained on)."""
from __future__ import annotations

from typing import Optional

from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, fingerprint
from transferset.app.stages.costs import Costing, Estimate, pipeline_estimate
from transferset.data.evalset import write_eval_set


def score_estimate(name: str, c: Costing) -> Estimate:
    """The transfer set's rows (the selection split's for dev.score), by each of the teachers, at the scoring rate."""
    n = c.rows.selection if name == "dev.score" else c.transfer
    text = f"{n:,} rows" + (f" × {c.members} teachers" if c.members > 1 and name != "dev.score" else "")
    return pipeline_estimate(name, text, n * c.members, c.rates.score_rows_s, c.rates.score_fixed_s * c.members)


def score_stage(r: Run, name: str, folder: str, source: str, source_dir: str, out: RunOutputs,
                kind: Optional[str] = None) -> StageDef:
    """A score pipeline run of the rows `source` (a stage) wrote in `source_dir`."""
    def score(folder: str, resume: bool = False):
        return r.fn.score(r.cfg.score, input=source_dir, teacher=out.scorer, output=folder,
                          beam_cfg=r.beams[name], resume=resume, overwrite=True)

    # a killed run of this key goes on from its whole shards (score --resume checks each against this run)
    return StageDef(name, folder, r.rules.score(r.cfg.score, len(out.members)), (source, "teacher"), kind=kind,
                    run=score, resume=lambda folder: score(folder, resume=True),
                    estimate=lambda c: score_estimate(name, c))


def dev_stage(r: Run, folder: str) -> StageDef:
    """The selection split as a set, its labels the transfer set's."""
    columns = list(r.augment.column_kwargs().values())
    return StageDef("dev", folder, lambda: {"dev": fingerprint(r.selection), "columns": columns, "labels": r.labels()},
                    run=lambda out: write_eval_set(r.selection, out, r.labels(), **r.augment.column_kwargs(),
                                                   overwrite=True))


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    out.scored, out.dev_scored = r.path("scored"), r.path("dev", "scored")
    dev_set = r.path("dev", "transfer")
    return [score_stage(r, "score", out.scored, "augment", out.transfer, out), dev_stage(r, dev_set),
            score_stage(r, "dev.score", out.dev_scored, "dev", dev_set, out, kind="score")]


KIND = register(StageKind("score", build, after=("augment",),
                          measures=lambda cfg, will_run: {"score": True} if {"score", "dev.score"} & will_run else {}))
