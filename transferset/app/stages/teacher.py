"""The teacher stage: a teacher fine-tuned here or given by its folder, or a teacher ensemble's members, each
its own stage, and an ensemble's "teacher" stage standing for them all downstream (its key made of theirs)."""
from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Optional, Sequence

from transferset import fs
from transferset.app.report import teacher_rows
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, fingerprint
from transferset.app.stages.costs import Costing, Estimate, Lever, Rows, epoch_loss
from transferset.config import RunConfig, TeacherConfig
from transferset.config.engine import TEACHER_OPTIM
from transferset.fs import remote
from transferset.teacher import ensemble


def given_teacher(name: str, path: str) -> StageDef:
    """A teacher given by its folder: its weights are the key."""
    return StageDef(name, path, {
        "path": path if fs.is_remote(path) else os.path.abspath(path),
        "weights": [fingerprint(f) for f in fs.listdir(path) if f.endswith(".safetensors")]})


def teacher_estimate(name: str, c: Costing) -> Estimate:
    """Its optimizer steps, each epoch's selection pass and checkpoint, and loading and saving the model."""
    tc, rows, rates = c.cfg.teacher, c.rows, c.rates
    per_epoch = max(1, math.ceil(rows.labeled / tc.batch_size))
    steps = per_epoch * tc.epochs if tc.max_steps is None else min(per_epoch * tc.epochs, tc.max_steps)
    epochs = math.ceil(steps / per_epoch)
    text = f"{rows.labeled:,} rows × {tc.epochs} epochs = {steps:,} steps of {tc.batch_size}"
    if rates.teacher_step_s is None or rates.score_rows_s is None:
        return Estimate(name, text, None)
    return Estimate(name, text, rates.teacher_fixed_s + steps * rates.teacher_step_s
                    + epochs * (rows.selection / rates.score_rows_s + rates.teacher_epoch_s))


def trained_teacher(r: Run, name: str, folder: str, tc, kind: Optional[str] = None) -> StageDef:
    """A teacher fine-tuned locally (a staging folder when run_dir is a URL), then uploaded: the score workers
    copy it from run_dir (fs.remote.local_teacher)."""
    def resumable(out: str) -> bool:
        return r.fn.can_resume_teacher(r.split_labels(tc), train=remote.local_file(r.labeled),
                                       dev=remote.local_file(r.selection), output=out)

    return StageDef(
        name, folder, lambda: {"settings": r.rules.teacher(tc), "selection": fingerprint(r.selection)}, ("data",),
        run=lambda out: r.fn.teacher(replace(r.split_labels(tc), resume=resumable(out)),
                                     train=remote.local_file(r.labeled),
                                     dev=remote.local_file(r.selection), output=out, overwrite=True),
        local=True, kind=kind, resumable=resumable, estimate=lambda c: teacher_estimate(name, c))


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    cfg = r.cfg
    out.model_stages.append("teacher")
    if not (cfg.teacher_paths or cfg.teacher_seeds):
        if cfg.teacher_path:  # an existing directory (runner.check_paths)
            out.teacher = cfg.teacher_path
            return [given_teacher("teacher", cfg.teacher_path)]
        out.teacher = r.path("teacher")
        return [trained_teacher(r, "teacher", out.teacher, r.teacher)]
    if cfg.teacher_paths:
        members = [given_teacher(f"teacher.{i}", p) for i, p in enumerate(cfg.teacher_paths)]
    else:
        members = [trained_teacher(r, f"teacher.seed{seed}", r.path("teachers", f"seed{seed}"),
                                   replace(r.teacher, seed=seed), kind="teacher")
                   for seed in cfg.teacher_seeds]
    out.members = [m.folder for m in members]
    out.teacher = out.members[ensemble.primary(ensemble.parse_combine(cfg.score.combine, len(members)))]
    out.combine = cfg.score.combine
    return [*members, StageDef("teacher", None, {"members": len(members)}, tuple(m.name for m in members))]


# A teacher epoch fewer, in points of the distilled student's selection accuracy: the teacher's second and third
# epochs bought +3.7 and +1.1 points of its own selection accuracy on the sst2 proxy (benchmarks/levers.py)
EPOCH_LOSS = epoch_loss(3.7, 1.1)
# Below 2 epochs the plan warns: a distilled student learns what its teacher knows, and the teacher's second epoch
# bought +3.7 points of its selection accuracy on the sst2 proxy at the default rate (benchmarks/levers.py)
NEEDS_EPOCHS = 2
ONE_EPOCH = ("a teacher's second epoch bought 3.7 points of selection accuracy on the sst2 proxy, and a distilled "
             "student learns what its teacher knows")


# The peak learning rate of a teacher the budget cuts to one epoch, where the run's is the default (5e-5): one epoch
# at 1.5e-4 gained on selection on both newcomer proxies, 3 seeds each (long 75.9 against 74.8, sst2 85.6 against
# 84.7; benchmarks/teacher_lr.py --epochs 1, docs/results.md "Where should a budget's minutes go?")
ONE_EPOCH_LR = 1.5e-4


def with_epochs(tc: TeacherConfig, epochs: int, own: TeacherConfig) -> TeacherConfig:
    """`tc` fine-tuned `epochs` epochs under a budget's cut (`own`: the teacher as the run set it): at one epoch cut
    from more, at ONE_EPOCH_LR where the run's rate is the default; otherwise at the run's own rate."""
    lr = own.optim.lr
    if epochs == 1 < own.epochs and lr == TEACHER_OPTIM["lr"]:
        lr = ONE_EPOCH_LR
    return replace(tc, epochs=epochs, optim=replace(tc.optim, lr=lr))


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The epochs of every teacher the run trains (an ensemble's members alike); one epoch at ONE_EPOCH_LR."""
    trained = tuple(s.name for s in stages if s.run is not None and (s.name == "teacher" or s.kind == "teacher"))
    if not trained:
        return []
    own = cfg.teacher
    return [Lever("teacher.epochs", own.epochs, list(range(own.epochs - 1, 0, -1)),
                  lambda c, v: replace(c, teacher=with_epochs(c.teacher, own.epochs if v is None else v, own)),
                  trained, EPOCH_LOSS, NEEDS_EPOCHS, ONE_EPOCH, epochs=True)]


def measures(cfg: RunConfig, will_run: set[str]) -> dict:
    """The fine-tuning's step, when a teacher (or an ensemble's member) trains."""
    return {"teacher": True} if any(n == "teacher" or n.startswith("teacher.") for n in will_run) else {}


KIND = register(StageKind("teacher", build, after=("data",), levers=levers, measures=measures,
                          report_rows=teacher_rows))
