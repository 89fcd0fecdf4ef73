"""The run's own time, planned before its first stage: each stage's rows and its minutes on this machine, from
rates a few seconds of calibration measure (transferset/app/planning/calibrate.py), each stage estimated by its own kind
(StageDef.estimate, transferset/app/stages/costs.py); transferset/app/planning/time_budget.py cuts the plan to fit
`budget_minutes`.

Rows are counted before anything runs: the labeled and unlabeled pools as the data stage will make them (its
split.json when that stage is current, else the train file counted as data/splits.py splits it); the transfer set
is labeled × (1 + n_iter) + unlabeled × (1 + unlabeled_n_iter), before dedup; each student trains its phases'
rows × epochs. Both are at most: dedup drops copies and early stopping ends a phase sooner. A stage whose folder
holds its current key is reused and costs nothing.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Iterator, Optional, Sequence

from transferset import fs
from transferset.app.stages.base import Stage, StageDef
from transferset.app.stages.context import DataFiles, splits_train, test_split
from transferset.app.stages.costs import (EXPORT_TIMING, Costing, Estimate, Rates, Rows, fp32_rate, made_from_teacher,
                                         teacher_weight, with_limit)
from transferset.config import ReportConfig, RunConfig
from transferset.data.splits import SPLIT_STATS_FILE, validation_rows
from transferset.runtime.errors import UserError
from transferset.sources import Example, SourceSpec, infer_label_names, read_source

SAMPLE_ROWS = 256  # train rows the calibration runs on


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transferset's notes while the plan reads files and loads models (the labels inferred, a new head, the forward
    path) are the stages' to say when they run."""
    logger = logging.getLogger("transferset")
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


# --- rows ------------------------------------------------------------------------------------------

def _read(path: str, cfg: RunConfig, limit: Optional[int] = None) -> tuple[list[Example], int]:
    a = cfg.augment
    with quiet():  # the data stage says what labels it infers
        labels = infer_label_names(path, label_column=a.label_column, opener=fs.open)
    spec = SourceSpec(path=path, label_names=labels, text_column=a.text_column, label_column=a.label_column)
    rows = read_source(spec, opener=fs.open)
    return [r for r in itertools.islice(rows, limit) if isinstance(r, Example)], len(labels)


def count_rows(cfg: RunConfig, files: DataFiles, data_dir: Optional[str], data_current: bool) -> Rows:
    """The pools as splits.split_data makes them (its split.json when the data stage is current); a sentence
    carve drops a few more rows than this counts."""
    test = test_split(cfg, files)
    tested = len(_read(test, cfg)[0]) if test else 0
    if data_current:
        s = fs.read_json(fs.join(data_dir, SPLIT_STATS_FILE))
        selection = s["validation_rows"] if cfg.validation is not None else len(_read(files.dev, cfg)[0])
        sample = tuple(e.text for e in _read(files.train, cfg, SAMPLE_ROWS)[0])
        return Rows(s["labeled_rows"], s["unlabeled_rows"], selection, s["rest_rows"], sample, tested)
    rows, classes = _read(files.train, cfg)
    sample = tuple(e.text for e in rows[:SAMPLE_ROWS])
    selection = validation_rows(rows, cfg.validation.rows) if cfg.validation is not None else None
    if selection is None:
        selection = len(_read(files.dev, cfg)[0]) if files.dev else 0
    if not splits_train(cfg):
        return Rows(min(cfg.labeled_limit or len(rows), len(rows)), 0, selection, 0, sample, tested)
    pool = len(rows) - (selection if cfg.validation is not None else 0)
    if cfg.lowres is not None:
        labeled = min(cfg.lowres.per_class * classes, pool)
        unlabeled = pool - labeled
    else:
        labeled = min(cfg.labeled_limit or pool, pool)
        unlabeled = pool - labeled if cfg.unlabeled_rows in (None, -1) else min(cfg.unlabeled_rows, pool - labeled)
    if cfg.unlabeled_limit is not None:
        unlabeled = min(unlabeled, cfg.unlabeled_limit)
    return Rows(labeled, unlabeled, selection, pool - labeled - unlabeled, sample, tested)


# --- minutes ---------------------------------------------------------------------------------------

def estimate(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows, rates: Rates, reused: set[str]) -> list[Estimate]:
    """Each stage's rows and seconds, in the plan's order, as its kind estimates it (StageDef.estimate) from `cfg` (a
    budget's cut of the config the stages were built with); a reused stage costs nothing."""
    costing = Costing(cfg, with_limit(cfg, rows), rates)
    return [Estimate(s.name, "", 0.0, reused=True) if s.name in reused or s.run is None
            else s.estimate(costing) if s.estimate is not None else Estimate(s.name, "", None) for s in stages]


# The report times every model in `latency_rounds` rounds of 16 rows at batch 1 and two batches of 64, after one
# untimed call at each batch size (transferset/runtime/timing.py); a student's timing, in seconds (load, both batch
# sizes). The models made from the teacher are evaluated on the selection split there too (report.compressed_rows).
STUDENT_TIMING_S = 0.5
BATCH_1_ROWS, BATCH_64_ROWS = 16, 128


def timed_rows(rows: int, settings: ReportConfig) -> int:
    """The rows the report's timing runs through each model, of `rows` selection rows."""
    n = min(rows, settings.latency_rows)
    return settings.latency_rounds * (min(n, BATCH_1_ROWS) + min(n, BATCH_64_ROWS)) + min(n, 1) + min(n, 64)


def report_estimate(models: Sequence[str], rows: int, settings: ReportConfig, rates: Rates) -> Estimate:
    """The report's timing of `models` (their names in the run: RunOutputs.models) on `rows` selection rows, at
    `rates` (the teacher's row on one thread, Rates.teacher_row_s), and its evaluation of the models made from the
    teacher on the selection split; estimated, not measured."""
    timed = timed_rows(rows, settings)
    weights = [teacher_weight(name) for name in models]
    teachers = sum(1 for w in weights if w)
    text = f"{len(models)} models × {timed:,} rows timed"
    if rates.score_rows_s is None:
        return Estimate("report", text, None)
    row_s = rates.teacher_row_s or 1.0 / fp32_rate(rates)
    exports = sum(EXPORT_TIMING for name in models if made_from_teacher(name))
    return Estimate("report", text, sum(weights) * timed * row_s + teachers * rates.score_fixed_s
                    + exports * rows / fp32_rate(rates) + (len(models) - teachers) * STUDENT_TIMING_S)


def total_seconds(estimates: Sequence[Estimate]) -> float:
    return sum(e.seconds or 0.0 for e in estimates)


# --- the plan, printed -----------------------------------------------------------------------------

def current(stages: Sequence[StageDef]) -> set[str]:
    """The stages a run would reuse: each whose folder holds its current key (Stage.current_key), and the inputs
    (no function to run), as long as every stage upstream is reused too. Settings read here may be cached by the
    plan (the transfer set's labels): the runner builds its plan again afterwards."""
    keys: dict[str, Optional[str]] = {}
    found: set[str] = set()
    for s in stages:
        keys[s.name] = None
        if all(u in found for u in s.upstream):  # else it runs after one that runs: what it reads is not there yet
            try:
                keys[s.name] = s.key([keys[u] for u in s.upstream])
            except (OSError, ValueError, KeyError, UserError):
                pass
        if s.run is None and keys[s.name] is not None:
            found.add(s.name)
        elif keys[s.name] is not None and s.folder and \
                Stage(s.name, s.folder, keys[s.name], s.done_file).current_key() is not None:
            found.add(s.name)
    return found


def plan_lines(estimates: Sequence[Estimate], rates: Rates, cuts: Sequence[str] = ()) -> list[str]:
    """The plan as `run` prints it before its first stage."""
    width = max(len(e.stage) for e in estimates)
    lines = [f"plan, estimated on this machine ({rates.measured}):"]
    for e in estimates:
        minutes = "reused" if e.reused else "not estimated" if e.seconds is None else f"{e.seconds / 60:6.1f} min"
        lines.append(f"  {e.stage:<{width}}  {minutes:>13}  {e.rows}".rstrip())
    total = f"{total_seconds(estimates) / 60:6.1f} min"
    lines.append(f"  {'total':<{width}}  {total:>13}  at most (dedup and early stopping make it less), "
                 "the stages not estimated apart")
    lines += [f"  {e.stage}: {e.note}" for e in estimates if e.note]
    if cuts:
        lines.append(f"cut to fit budget_minutes: {'; '.join(cuts)}")
    if rates.load is not None and rates.cores and rates.load > rates.cores:
        lines.append(f"measured on a busy machine (load {rates.load:.1f} on {rates.cores} cores): the minutes may be "
                     "several times what the stages take once the other work ends"
                     + ("; the budget's cuts follow them" if cuts else ""))
    return lines
