"""What every stage kind reads: the run's settings, files, functions and folders (`Run`), and the fingerprints
that put the content of files into keys."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from pipelines.augment import run_augment
from pipelines.score import run_score
from students.compress.exits_train import train_exits
from students.compress.export import export as export_model
from students.compress.prune import prune as prune_model
from students.evaluate import evaluate
from students.trainer import train as train_student
from transferset import fs
from transferset.app.stages import keys
from transferset.app.report import write_report
from transferset.config import AugmentConfig, BeamConfig, RunConfig
from transferset.data import transfer
from transferset.data.splits import LABELED_FILE, SPLIT_STATS_FILE, UNLABELED_FILE, VALIDATION_FILE
from transferset.models import loading
from transferset.runtime.progress import log_line
from transferset.teacher.train import can_resume as can_resume_teacher
from transferset.teacher.train import train as train_teacher


@dataclass(frozen=True)
class DataFiles:
    """Where a run's data comes from, and which split each role uses."""

    train: str
    dev: Optional[str]  # the task's dev file (None: a train file whose selection split is carved from it)
    test: Optional[str]  # a labeled test file (data folder's test.tsv or `test:`), else None


@dataclass(frozen=True)
class StageFunctions:
    """What the stages call: the subcommands' functions; a test passes its own (a value, not a patch)."""

    teacher: Callable = train_teacher
    augment: Callable = run_augment
    score: Callable = run_score
    student: Callable = train_student
    evaluate: Callable = evaluate
    report: Callable = write_report
    # compress:
    export: Callable = export_model
    exits: Callable = train_exits
    prune: Callable = prune_model
    # whether a teacher's folder holds a checkpoint of this very training to go on from (teacher.train.can_resume)
    can_resume_teacher: Callable = can_resume_teacher


def teacher_source(cfg: RunConfig) -> str:
    """The model the teacher stages start from (its local copy where one is packaged), or the teacher given."""
    return cfg.teacher_path or (cfg.teacher_paths[0] if cfg.teacher_paths else loading.resolve_model(cfg.teacher.model))


def splits_train(cfg: RunConfig) -> bool:
    """Whether the run's data stage splits the train file (labeled, unlabeled, validation, rest)."""
    return cfg.lowres is not None or cfg.unlabeled_rows is not None or cfg.validation is not None


def test_split(cfg: RunConfig, files: DataFiles) -> Optional[str]:
    """The split every model is scored on at the end: the test file, else the task's dev file when the selection
    split is carved from train (validation), else none."""
    return files.test or (files.dev if cfg.validation is not None else None)


def fingerprint(path: str) -> str:
    """Content hash of an input file, local or URL (or the spec itself for hub datasets)."""
    if path.startswith("hf:") or not fs.isfile(path):
        return path
    h = hashlib.sha256()
    with fs.open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def set_fingerprint(directory: str) -> str:
    """Of a transfer set a stage reads but no stage of the run makes (a student's `layer_texts`): its
    Parquet shards' names and sizes and its completion marker, so a set written again at that path gets a
    new key. (Hashing every byte of a set of millions of rows each time a run starts would not be cheap.)"""
    if not fs.isdir(directory):
        return directory  # the student's own checks refuse it when the stage runs
    h = hashlib.sha256()
    for f in sorted(transfer.data_files(directory)):
        h.update(f"{fs.basename(f)}\t{fs.size(f)}\n".encode())
    marker = transfer.complete_marker(directory)
    h.update(fs.read_text(marker).encode() if fs.exists(marker) else b"incomplete")
    return h.hexdigest()


def stage_beam(cfg: RunConfig) -> dict[str, BeamConfig]:
    """The Beam settings each pipeline stage runs with.

    augment and score run where the `beam:` section says (e.g. Dataflow); the dev set is a few
    hundred rows, scored once in this process (FnApiRunner), wherever the big stages run.
    """
    return {"augment": cfg.beam, "score": cfg.beam, "dev.score": BeamConfig()}


@dataclass(frozen=True)
class Run:
    """What every stage kind reads: the run's settings, functions and folders (one teacher or an ensemble's)."""

    cfg: RunConfig
    files: DataFiles
    fn: StageFunctions
    beams: dict[str, BeamConfig]
    split: bool  # the data stage splits train
    teacher: Any  # the teacher: section, with labeled_limit as its limit when nothing is split
    augment: AugmentConfig  # likewise
    rules: keys.KeyRules = keys  # the key rules (this layout's; `transferset migrate` passes an earlier one's)
    log: Callable[[str], None] = log_line  # the run's log, for a stage that runs stages of its own (the search)

    def path(self, *parts: str) -> str:
        """A path in the run folder."""
        return fs.join(self.cfg.run_dir, *parts)

    def split_labels(self, section: Any) -> Any:
        """`section` (teacher: or augment:) with the split's label set (train's, split.json) when train is split
        and the section names none: a class no labeled row holds keeps its place in the teacher's head."""
        if not self.split or section.labels:
            return section
        return replace(section, labels=tuple(fs.read_json(fs.join(self.data_dir, SPLIT_STATS_FILE))["label_names"]))

    @property
    def data_dir(self) -> Optional[str]:
        return self.path("data") if self.split else None

    @property
    def labeled(self) -> str:
        return fs.join(self.data_dir, LABELED_FILE) if self.split else self.files.train

    @property
    def unlabeled(self) -> Optional[str]:
        return fs.join(self.data_dir, UNLABELED_FILE) if self.split else None

    @property
    def selection(self) -> str:
        return fs.join(self.data_dir, VALIDATION_FILE) if self.cfg.validation is not None else self.files.dev

    @property
    def test(self) -> Optional[str]:
        return test_split(self.cfg, self.files)

    @property
    def guarded(self) -> list[str]:
        """The evaluation files, kept out of every transfer set."""
        return list(dict.fromkeys(p for p in (self.selection, self.files.dev, self.test) if p))

    @property
    def guarded_fingerprints(self) -> list[str]:
        return [fingerprint(p) for p in self.guarded]

    @functools.cached_property
    def labels(self) -> Callable[[], list[str]]:
        # every shard's metadata, read once the augment stage has written them
        return functools.cache(lambda: transfer.label_names(self.path("transfer")))


def make_run(cfg: RunConfig, files: DataFiles, fn: StageFunctions, rules: keys.KeyRules = keys,
             log: Callable[[str], None] = log_line) -> Run:
    split = splits_train(cfg)
    # Without a split, labeled_limit reads the first N rows of train in every stage.
    limit = None if split else cfg.labeled_limit
    return Run(cfg, files, fn, stage_beam(cfg), split, replace(cfg.teacher, limit=limit) if limit else cfg.teacher,
               replace(cfg.augment, limit=limit) if limit else cfg.augment, rules, log)
