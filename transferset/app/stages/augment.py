"""The augment stage: the transfer set, the labeled and unlabeled rows and their variants, the evaluation
files kept out of it."""
from __future__ import annotations

from typing import Optional

from transferset.app.stages.base import RunOutputs, StageDef, StageKind, register
from transferset.app.stages.context import Run
from transferset.config import AugmentConfig


def augment_stage(r: Run, name: str, folder: str, a: AugmentConfig, inputs: list[str], unlabeled: list[str],
                  upstream: tuple[str, ...] = ("data",), kind: Optional[str] = None) -> StageDef:
    """An augment pipeline run: the transfer set, or the layer_texts set of the rows no pool took."""
    return StageDef(name, folder, lambda: r.rules.augment(a, r.guarded_fingerprints), upstream, kind=kind,
                    run=lambda out: r.fn.augment(r.split_labels(a), inputs=inputs, unlabeled=unlabeled,
                                                 exclude=r.guarded, output=out,
                                                 beam_cfg=r.beams["augment"], overwrite=True))


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    out.transfer = r.path("transfer")
    return [augment_stage(r, "augment", out.transfer, r.augment, [r.labeled], [r.unlabeled] if r.unlabeled else [])]


KIND = register(StageKind("augment", build, after=("teacher",)))
