"""The data stage: the train file, and how the run splits it (labeled and unlabeled pools, the carved
validation split, the rest); a stage only when a split is asked, an input key always."""
from __future__ import annotations

from transferset import fs
from transferset.app.stages.base import RunOutputs, StageDef, StageKind, register
from transferset.app.stages.context import Run, fingerprint
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


KIND = register(StageKind("data", build))
