"""The layer_texts stage (`students.NAME.layer_texts: rest`): the train file's rows no pool took, as they are
(no variants), for the students' phases on layer losses alone; made once, only when a student asks for it."""
from __future__ import annotations

from dataclasses import replace

from transferset import fs
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run
from transferset.app.stages.costs import pipeline_estimate
from transferset.config import LAYER_TEXTS_REST
from transferset.data.splits import REST_FILE
from transferset.runtime.errors import UserError


def rest_file(data_dir: str) -> str:
    """The data stage's rest.jsonl, which a data folder split before it existed lacks."""
    path = fs.join(data_dir, REST_FILE)
    if not fs.exists(path):
        raise UserError(f"{path} is missing: {data_dir} was split by an earlier transferset. Delete that folder "
                        "and run again: the split is redone (seconds), and the stages after it are reused")
    with fs.open(path, "rb") as fh:
        if not fh.readline().strip():
            raise UserError(f"layer_texts: {LAYER_TEXTS_REST}: the labeled and unlabeled pools and the validation "
                            "split took every row of the train file, so none is left: lower labeled_limit or "
                            "unlabeled_rows, or give a transfer set's path")
    return path


def students_reading_rest(r: Run) -> set[str]:
    return {name for name, s_cfg in r.cfg.students.items() if s_cfg.layer_texts == LAYER_TEXTS_REST}


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    if not students_reading_rest(r):
        return []
    as_is = replace(r.augment, n_iter=0, unlabeled_n_iter=0, limit=None)
    return [StageDef("layer_texts", r.path("layer_texts"), lambda: r.rules.augment(as_is, r.guarded_fingerprints),
                     ("data",), run=lambda folder: r.fn.augment(as_is, inputs=[rest_file(r.data_dir)], unlabeled=[],
                                                               exclude=r.guarded, output=folder,
                                                               beam_cfg=r.beams["augment"], overwrite=True),
                     estimate=lambda c: pipeline_estimate("layer_texts", f"{c.rows.rest:,} rows", c.rows.rest,
                                                          c.rates.augment_rows_s))]


KIND = register(StageKind("layer_texts", build, after=("score",),
                          measures=lambda cfg, will_run: {"augment": True} if "layer_texts" in will_run else {}))
