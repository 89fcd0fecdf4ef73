"""The augment stage: the transfer set, the labeled and unlabeled rows and their variants, the evaluation
files kept out of it."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from transferset.app.stages.base import RunOutputs, StageDef, StageKind, register
from transferset.app.stages.context import Run
from transferset.app.stages.costs import Costing, Estimate, joined_rows, pipeline_estimate
from transferset.config import AugmentConfig


def augment_estimate(name: str, c: Costing) -> Estimate:
    """The transfer set's rows (before dedup) at the augment ops' rate."""
    a, rows, joined = c.cfg.augment, c.rows, joined_rows(c.cfg, c.rows)
    text = (f"{rows.labeled:,} labeled × {1 + a.variants_for(True)} + {rows.unlabeled:,} unlabeled × "
            f"{1 + a.variants_for(False)}" + (f" + {joined:,} joined" if joined else "") + f" = {c.transfer:,} (before dedup)")
    return pipeline_estimate(name, text, c.transfer, c.rates.augment_rows_s, c.rates.augment_fixed_s)


def augment_stage(r: Run, name: str, folder: str, a: AugmentConfig, inputs: list[str], unlabeled: list[str],
                  upstream: tuple[str, ...] = ("data",), kind: Optional[str] = None) -> StageDef:
    """An augment pipeline run: the transfer set, or the layer_texts set of the rows no pool took."""
    return StageDef(name, folder, lambda: r.rules.augment(a, r.guarded_fingerprints), upstream, kind=kind,
                    run=lambda out: r.fn.augment(r.split_labels(a), inputs=inputs, unlabeled=unlabeled,
                                                 exclude=r.guarded, output=out,
                                                 beam_cfg=r.beams["augment"], overwrite=True))


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    out.transfer = r.path("transfer")
    stage = augment_stage(r, "augment", out.transfer, r.augment, [r.labeled], [r.unlabeled] if r.unlabeled else [])
    return [replace(stage, estimate=lambda c: augment_estimate("augment", c))]


KIND = register(StageKind("augment", build, after=("teacher",)))
