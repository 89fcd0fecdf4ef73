"""The data stage: the train file, and how the run splits it (labeled and unlabeled pools, the carved
validation split, the rest); a stage only when a split is asked, an input key always."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from transferset import fs
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, fingerprint, splits_train
from transferset.app.stages.costs import Lever, Rows, halvings
from transferset.config import RunConfig
from transferset.data.splits import (LABELED_FILE, REJECTS_FILE, REST_FILE, SPLIT_STATS_FILE, UNLABELED_FILE,
                               VALIDATION_FILE, split_data)


def split_stage(train: str, out: str, cfg: RunConfig) -> dict:
    """split_data writes its files by name, without the output protocol; they are cleared by name first, so a
    split that writes fewer (no validation) leaves none of an earlier one's beside them."""
    fs.delete([fs.join(out, name) for name in (LABELED_FILE, UNLABELED_FILE, VALIDATION_FILE, REST_FILE,
                                               REJECTS_FILE, SPLIT_STATS_FILE)])
    return split_data(train, out, cfg)


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    out.data = r.data_dir
    return [StageDef("data", r.data_dir, r.rules.data(r.cfg, fingerprint(r.files.train)),
                     run=(lambda folder: split_stage(r.files.train, folder, r.cfg)) if r.split else None,
                     done_file=SPLIT_STATS_FILE)]


# Half the unlabeled rows, in points of the distilled student's selection accuracy: real in-domain text pays more
# than variants of it (docs/results.md, by data size)
UNLABELED_LOSS = 1.0


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The unlabeled rows the run takes (unlabeled_limit), halved, when it splits train into pools."""
    if not (splits_train(cfg) and rows.unlabeled):
        return []
    return [Lever("unlabeled rows", rows.unlabeled, halvings(rows.unlabeled, 0),
                  lambda c, v: replace(c, unlabeled_limit=cfg.unlabeled_limit if v is None else v), ("data",),
                  lambda _: UNLABELED_LOSS)]


KIND = register(StageKind("data", build, levers=levers))
