"""The job shell: what every training command does around its training, written once.

The teacher (transferset/teacher/train.py), the students (students/trainer.py), prune's recovery
(students/compress/prune.py) and the exits (students/compress/exits_train.py) are each a `Job`: they
supply the data, the model, the steps, the final evaluation and the saving; `run_job` does the rest:

    check_engine                        the engine section, before anything is read
    rank 0 only: Output(...).writing()  the output protocol (transferset.fs.output): owned, checked, --overwrite
      job.check()                       read and check every input; nothing under OUTPUT changes before this
      out.prepare()                     clear what an earlier run wrote (a resumed run keeps checkpoint/, metrics.jsonl)
      out.local()                       a URL is trained in a local staging folder, uploaded at the end
    job.prepare(run)                    what is computed once before the steps (rejects, cached features)
    Engine.create, engine.seeded,       the device and processes, the training's random state, OUTPUT/checkpoint/,
    Recipe, start_tracking              the tracker and OUTPUT/metrics.jsonl
    job.phases(engine) → recipe.run     the steps, phase by phase
    job.trained(run)                    every rank, once the steps are done
    rank 0 only: job.evaluate, job.save the model and the metrics, then metrics.json (job.metrics_file) and
                                        README.md (the model card, where job.card), then the checkpoint goes

Under `torchrun` every rank runs the job on its own rows; rank 0 alone owns the output and writes, and
the other ranks return {"rank": r} (their local folder is OUTPUT itself: the checkpoint is read from it).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import torch

from transferset.config import EngineConfig
from transferset.contract import schema
from transferset.data.card import write_card
from transferset.fs.output import Output
from transferset.training.checkpoints import Checkpoints
from transferset.training.engine import TRACK_DIR, TRACK_FILE, Engine, check_engine, launched_processes
from transferset.training.recipe import LossStep, PhaseSpec, Recipe

CHECKPOINT_DIR = "checkpoint"  # OUTPUT/checkpoint/: what a killed training resumes from; removed once it is saved


@dataclass
class JobPhase:
    """One run of the recipe (Recipe.run's arguments); `logged` is added to its log entry once it ran."""

    spec: PhaseSpec
    module: torch.nn.Module
    loss_step: LossStep
    batches: Callable[[int], Iterable[dict]]
    evaluate: Optional[Callable[[], dict]]
    make_optimizer: Callable[[], torch.optim.Optimizer]
    describe: Optional[dict] = None
    logged: dict = field(default_factory=dict)


@dataclass
class Skipped:
    """A phase that does not run, with the record its place in the phase log gets."""

    record: dict


@dataclass
class JobRun:
    """What the shell hands a job's hooks as the job goes."""

    out: Optional[Output]  # rank 0's output; None on the other ranks
    work: Optional[str]  # the local folder written into (the other ranks: OUTPUT itself, never written)
    engine: Optional[Engine] = None  # None until the steps begin, and for a job that does not train
    recipe: Optional[Recipe] = None
    entries: list = field(default_factory=list)  # each phase's log entry (None: finished before a resume)
    seconds: float = 0.0  # the training's wall time: the steps and the evaluations between epochs

    @property
    def main(self) -> bool:
        return self.out is not None


class Job:
    """A training command, as the shell runs it. Subclasses set the attributes and supply the hooks."""

    command: str = ""  # the output's command (transferset.fs.output.WHAT)
    names: Sequence[str] = ()  # the top-level entries it writes (checkpoint/ too), but metrics.jsonl and logs/
    project: str = ""  # the tracker's project name
    metrics_file: str = schema.METRICS_FILE
    card: bool = False  # write README.md, the model card, from the records saved
    resume: bool = False  # go on from OUTPUT/checkpoint/ (a job with a `fingerprint`)
    checkpoint_steps: Optional[int] = None  # a checkpoint every N steps besides each epoch's end
    seed: Optional[int] = None  # torch's generator for the steps, the caller's given back after (None: untouched)
    progress_bar: Optional[bool] = None  # Engine.create's
    where: str = "engine"  # the engine section's name in messages

    def __init__(self, engine: EngineConfig, log: Callable[[str], None]):
        self.engine, self.log = engine, log

    # --- the hooks --------------------------------------------------------------------------------------
    def check(self) -> None:
        """Read and check the inputs (data and model), before anything under OUTPUT changes."""

    def prepare(self, run: JobRun) -> None:
        """What the steps need computed once, after OUTPUT was cleared (rank 0 writes through run.out)."""

    def trains(self) -> bool:
        """Whether there are steps to run (no engine is created otherwise)."""
        return True

    def fingerprint(self, engine: Engine) -> Optional[dict]:
        """What a checkpoint must share with the run resuming it; None: the job keeps no checkpoint."""
        return None

    def tracked(self) -> dict:
        """The settings the tracker records."""
        return {}

    def phases(self, engine: Engine) -> Iterator[Union[JobPhase, Skipped]]:
        return iter(())

    def module(self) -> Optional[torch.nn.Module]:
        """What a checkpoint written after the last phase restores (None: nothing to restore)."""
        return None

    def trained(self, run: JobRun) -> None:
        """Every rank, after the steps (collectives go here: the other ranks stop after it)."""

    def evaluate(self, run: JobRun) -> dict:
        """Rank 0, after the steps: → the metrics."""
        return {}

    def save(self, run: JobRun, metrics: dict) -> None:
        """Rank 0: the model into run.work (the metrics may gain what saving tells, e.g. a weights hash)."""


def other_rank() -> bool:
    """Whether this process is a rank other than 0 of a launched process group."""
    return launched_processes() > 1 and int(os.environ.get("RANK", "0")) != 0


def run_job(job: Job, output: str, *, inputs: Sequence[Optional[str]] = (), overwrite: bool = False) -> dict:
    """Run `job` into `output` (a local folder or a URL), as the module docstring says; → the metrics."""
    check_engine(job.engine, job.where)
    if other_rank():
        job.check()
        return _train(job, JobRun(None, output))
    out = Output(output, job.command, names=(*job.names, TRACK_FILE, TRACK_DIR),
                 overwrite=overwrite, inputs=inputs)
    with out.writing():
        job.check()
        # every check passed: clear what an earlier run wrote (a resumed run keeps its checkpoint and the
        # metrics lines written up to it)
        out.prepare(keep=[CHECKPOINT_DIR, TRACK_FILE] if job.resume else [])
        with out.local() as work:
            metrics = _train(job, JobRun(out, work))
    return metrics


def checkpoints_at(folder: str, fingerprint: dict, every_steps: Optional[int] = None) -> Checkpoints:
    """FOLDER/checkpoint/ with `fingerprint`."""
    return Checkpoints(os.path.join(folder, CHECKPOINT_DIR), fingerprint, every_steps=every_steps)


def _train(job: Job, run: JobRun) -> dict:
    job.prepare(run)
    if job.trains():
        run.engine = Engine.create(job.engine, output=run.work if run.main else None, log=job.log,
                                   progress_bar=job.progress_bar)
        _steps(job, run)
    job.trained(run)
    if not run.main:
        if run.recipe is not None:
            run.recipe.finish()
        return {"rank": run.engine.rank if run.engine is not None else int(os.environ.get("RANK", "0"))}
    metrics = job.evaluate(run)
    job.save(run, metrics)
    write_metrics(os.path.join(run.work, job.metrics_file), metrics)
    if job.card:
        write_card(run.work, shown_as=run.out.path)  # README.md: the model card, from the records just written
    if run.recipe is not None:
        run.recipe.finish()
    return metrics


def _steps(job: Job, run: JobRun) -> None:
    """Every phase of the job through one recipe, under the job's seed."""
    engine, started = run.engine, time.perf_counter()
    fingerprint = job.fingerprint(engine)
    checkpoints = None if fingerprint is None else checkpoints_at(run.work, fingerprint, job.checkpoint_steps)
    with engine.seeded(job.seed) if job.seed is not None else contextlib.nullcontext():
        run.recipe = recipe = Recipe(engine, checkpoints, resume=job.resume)
        engine.start_tracking(job.project, job.tracked())  # after the recipe: a resume keeps the lines written
        for index, phase in enumerate(job.phases(engine)):
            if isinstance(phase, Skipped):
                recipe.skip(index, phase.record)
                continue
            entry = recipe.run(index, phase.spec, phase.module, phase.loss_step, phase.batches, phase.evaluate,
                               phase.make_optimizer, describe=phase.describe)
            if entry is not None:
                entry.update(phase.logged)
            run.entries.append(entry)
        module = job.module()
        if module is not None:
            recipe.restore_finished(module)
    run.seconds = time.perf_counter() - started


def write_metrics(path: str, metrics: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True, default=list)
        fh.write("\n")
