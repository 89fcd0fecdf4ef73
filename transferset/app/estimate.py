"""The run's own time, planned before its first stage: each stage's rows and its minutes on this machine, from
rates a few seconds of calibration measure (transferset/app/calibrate.py); transferset/app/time_budget.py cuts
the plan to fit `budget_minutes`.

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
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

from students.losses import LossWeights
from students.schedules import phases
from transferset import fs
from transferset.augment import join
from transferset.app.stages import Stage, StageDef
from transferset.app.stages.context import DataFiles, splits_train
from transferset.app.stages.search import EXITS, base_of, candidate_configs, in_budget, rung_sizes, searched
from transferset.app.stages.search_space import Space
from transferset.config import RunConfig
from transferset.data.splits import SPLIT_STATS_FILE, validation_rows
from transferset.runtime.errors import UserError
from transferset.sources import Example, SourceSpec, infer_label_names, read_source

BEAM_START_S = 3.0  # a local Beam pipeline's start and finish (FnApiRunner, 2 workers): assumed, not measured
SAMPLE_ROWS = 256  # train rows the calibration runs on


@dataclass(frozen=True)
class Rows:
    """The rows the run's stages read, counted before they run."""

    labeled: int
    unlabeled: int
    selection: int
    rest: int = 0  # train rows no pool takes (a student's `layer_texts: rest`)
    sample: tuple[str, ...] = ()  # the first train texts, for the calibration


@dataclass(frozen=True)
class Rates:
    """What the calibration measured on this machine (None: not measured, the stage is not estimated)."""

    teacher_step_s: Optional[float] = None  # one optimizer step at teacher.batch_size and max_length
    score_rows_s: Optional[float] = None  # rows the teacher scores per second (scoring, its evaluation)
    augment_rows_s: Optional[float] = None  # transfer rows made per second (contexts and variants), in process
    student_step_s: dict[str, float] = field(default_factory=dict)  # one step at the student's batch_size
    teacher_fixed_s: float = 0.0  # a teacher stage's own start and end: loading the model, saving it
    teacher_epoch_s: float = 0.0  # each epoch's checkpoint (weights and optimizer state)
    score_fixed_s: float = 0.0  # a score stage's teacher, loaded and made ready in its worker
    augment_fixed_s: float = 0.0  # the augment ops' models (a POS tagger, an MLM), loaded
    student_fixed_s: dict[str, float] = field(default_factory=dict)  # a student built, and its latency timed
    tokenize_rows_s: Optional[float] = None  # rows tokenized per second (a vocabulary made from the transfer set)
    measured: str = ""  # what was measured, in words
    load: Optional[float] = None  # the machine's 1-minute load average when the calibration began
    cores: Optional[int] = None  # the cores this process may use
    probed: dict[str, Any] = field(default_factory=dict)  # by stage: what its probe measured (StageDef.probe)


@dataclass(frozen=True)
class Estimate:
    stage: str
    rows: str  # the rows, as arithmetic
    seconds: Optional[float]  # None: not estimated
    reused: bool = False
    note: str = ""  # what the plan says of the stage below its table (the search's candidates the teacher cannot give)


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
    if data_current:
        s = fs.read_json(fs.join(data_dir, SPLIT_STATS_FILE))
        selection = s["validation_rows"] if cfg.validation is not None else len(_read(files.dev, cfg)[0])
        sample = tuple(e.text for e in _read(files.train, cfg, SAMPLE_ROWS)[0])
        return Rows(s["labeled_rows"], s["unlabeled_rows"], selection, s["rest_rows"], sample)
    rows, classes = _read(files.train, cfg)
    sample = tuple(e.text for e in rows[:SAMPLE_ROWS])
    selection = validation_rows(rows, cfg.validation.rows) if cfg.validation is not None else None
    if selection is None:
        selection = len(_read(files.dev, cfg)[0]) if files.dev else 0
    if not splits_train(cfg):
        return Rows(min(cfg.labeled_limit or len(rows), len(rows)), 0, selection, 0, sample)
    pool = len(rows) - (selection if cfg.validation is not None else 0)
    if cfg.lowres is not None:
        labeled = min(cfg.lowres.per_class * classes, pool)
        unlabeled = pool - labeled
    else:
        labeled = min(cfg.labeled_limit or pool, pool)
        unlabeled = pool - labeled if cfg.unlabeled_rows in (None, -1) else min(cfg.unlabeled_rows, pool - labeled)
    if cfg.unlabeled_limit is not None:
        unlabeled = min(unlabeled, cfg.unlabeled_limit)
    return Rows(labeled, unlabeled, selection, pool - labeled - unlabeled, sample)


def transfer_rows(cfg: RunConfig, rows: Rows) -> int:
    """The transfer set before dedup: each row and its variants, and the rows the join op makes of them."""
    a = cfg.augment
    return (rows.labeled * (1 + a.variants_for(True)) + rows.unlabeled * (1 + a.variants_for(False))
            + joined_rows(cfg, rows))


def joined_rows(cfg: RunConfig, rows: Rows) -> int:
    """The rows the join op (transferset/augment/join.py) makes of the originals: `joins` per original."""
    a = cfg.augment
    return round((rows.labeled + rows.unlabeled) * a.joins) if join.OP in a.ops else 0


def with_limit(cfg: RunConfig, rows: Rows) -> Rows:
    """`rows` under cfg's unlabeled_limit (a cut's)."""
    if cfg.unlabeled_limit is None or rows.unlabeled <= cfg.unlabeled_limit:
        return rows
    return replace(rows, unlabeled=cfg.unlabeled_limit, rest=rows.rest + rows.unlabeled - cfg.unlabeled_limit)


# --- minutes ---------------------------------------------------------------------------------------

def teacher_estimate(name: str, tc, rows: Rows, rates: Rates) -> Estimate:
    per_epoch = max(1, math.ceil(rows.labeled / tc.batch_size))
    steps = per_epoch * tc.epochs if tc.max_steps is None else min(per_epoch * tc.epochs, tc.max_steps)
    epochs = math.ceil(steps / per_epoch)
    text = f"{rows.labeled:,} rows × {tc.epochs} epochs = {steps:,} steps of {tc.batch_size}"
    if rates.teacher_step_s is None or rates.score_rows_s is None:
        return Estimate(name, text, None)
    return Estimate(name, text, rates.teacher_fixed_s + steps * rates.teacher_step_s
                    + epochs * (rows.selection / rates.score_rows_s + rates.teacher_epoch_s))


def student_estimate(name: str, s_cfg, transfer: int, rows: Rows, rates: Rates, key: Optional[str] = None) -> Estimate:
    """Each phase's rows (the labeled ones alone for a phase on gold labels only) × its epochs, at most; `key`: the
    student's rates (None: the stage's name after `students.`)."""
    plan = phases(s_cfg.phases, LossWeights.of(s_cfg), s_cfg.epochs, layer_epochs=s_cfg.layer_epochs)
    seen = sum((rows.labeled if p.labeled_only else transfer) * p.epochs for p in plan)
    epochs = sum(p.epochs for p in plan)
    text = f"{seen // max(1, epochs):,} rows × {epochs} epochs = {seen:,}"
    key = key or name.split(".", 1)[1]
    step = rates.student_step_s.get(key)
    if step is None:
        return Estimate(name, text + " (not calibrated)", None)
    steps = sum(math.ceil((rows.labeled if p.labeled_only else transfer) / s_cfg.batch_size) * p.epochs
                for p in plan)
    # each epoch ends with the selection split's forward passes (about a third of a training step per batch); a
    # vocabulary made from the transfer set reads it once first
    evaluation = epochs * math.ceil(rows.selection / s_cfg.batch_size) * step / 3
    vocabulary = transfer / rates.tokenize_rows_s if rates.tokenize_rows_s and (
        s_cfg.trim_vocab or s_cfg.tokens == "words") else 0.0
    return Estimate(name, text, rates.student_fixed_s.get(key, 0.0) + vocabulary + vectors_seconds(s_cfg, transfer, rates)
                    + steps * step + evaluation)


def vectors_seconds(s_cfg, transfer: int, rates: Rates) -> float:
    """`embed_init: contextual` reads the transfer set's first texts through the teacher before the student trains:
    as many rows at the teacher's scoring rate."""
    if s_cfg.embed_init != "contextual" or not rates.score_rows_s:
        return 0.0
    from students.data.vectors import CONTEXT_TEXTS

    return min(transfer, CONTEXT_TEXTS) / rates.score_rows_s


def search_estimate(name: str, sc, transfer: int, rows: Rows, rates: Rates, space: Optional[Space] = None) -> Estimate:
    """Each rung's candidates × its epochs, the slowest counted: at most. With the search's untrained timing
    (`rates.probed`, search_timing.probe) only the variants in budget count, a candidate trained once for its
    variants (an int8 variant trains as its candidate); without it every candidate counts, the timing unknown.
    `space`: the candidates the run's teacher can give (search.searched; None: every candidate of `sc`)."""
    space = space or Space(candidate_configs(sc), {}, "")
    configs = space.configs
    note = (f"dropped before the first stage, the teacher ({space.teacher}) cannot give them: {space.said()}"
            if space.dropped else "")
    probed = rates.probed.get(name)
    timed = probed and probed["variants"]
    how = "timed untrained" + (f", {probed['before']}" if probed and probed["before"] else "")
    alive = list(configs) if timed is None else in_budget(timed, sc)
    if not alive:
        return Estimate(name, f"none of {len(timed)} variants in budget ({how}): the search refuses", 0.0, note=note)
    bases = list(dict.fromkeys(base_of(v) for v in alive))
    sizes = rung_sizes(len(alive), sc.rungs, sc.keep)
    kept = f"{len(bases)} candidate{'s' * (len(bases) > 1)}"
    text = (f"{len(configs)} candidates, before the budget's timing drops any; " if timed is None else
            f"{len(alive)} of {len(timed)} variants in budget ({how}), {kept}; ") + \
        ", ".join(f"{n} × {e} epochs" for n, e in zip(sizes, sc.rungs))
    cost: dict[int, list[float]] = {}
    for c in bases:
        dropped_exits = any(EXITS in v and base_of(v) == c for v in space.dropped)
        exits = any(EXITS in v and base_of(v) == c for v in alive) or (timed is None and not dropped_exits)
        for i, epochs in enumerate(sc.rungs):
            e = student_estimate(name, replace(configs[c], epochs=epochs), transfer, rows, rates, key=f"search.{c}")
            if e.seconds is None:
                return Estimate(name, f"{text} ({c} not calibrated)", None, note=note)
            # contextual vectors: made at the first rung, read from the cache at the next (students/data/vectors.py)
            again = vectors_seconds(configs[c], transfer, rates) if i else 0.0
            cost.setdefault(epochs, []).append(e.seconds - again + (exits_seconds(configs[c], sc, transfer, rates,
                                                                                  f"search.{c}") if exits else 0.0))
    # the untrained timing: each candidate built and timed; none left when the plan took it on the search's inputs,
    # as long again when it took it before them (the search times them again on the trained teacher)
    timing = (sum(rates.student_fixed_s.get(f"search.{c}", 0.0) for c in configs) if probed is None else
              probed["seconds"] if probed["before"] else 0.0)
    return Estimate(name, text, timing + sum(sum(sorted(cost[e])[-n:]) for n, e in zip(sizes, sc.rungs)), note=note)


def exits_seconds(s_cfg, sc, transfer: int, rates: Rates, key: str) -> float:
    """A transformer candidate's early exits (`search.exit_speeds`) at a rung: its forward over the transfer set (a
    third of a training step per batch, as an evaluation; the branches' epochs on the cached states cost little)."""
    step = rates.student_step_s.get(key)
    if not sc.exit_speeds or s_cfg.student != "transformer" or step is None:
        return 0.0
    return math.ceil(transfer / s_cfg.batch_size) * step / 3


def _pipeline(name: str, text: str, n: int, rate: Optional[float], fixed: float = 0.0) -> Estimate:
    return Estimate(name, text, None if rate is None else BEAM_START_S + fixed + n / rate)


def estimate(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows, rates: Rates, reused: set[str]) -> list[Estimate]:
    """Each stage's rows and seconds, in the plan's order; a reused stage costs nothing."""
    rows = with_limit(cfg, rows)
    transfer = transfer_rows(cfg, rows)
    members = len(cfg.teacher_paths or cfg.teacher_seeds or [None])
    a = cfg.augment
    out = []
    for s in stages:
        if s.name in reused or s.run is None:
            out.append(Estimate(s.name, "", 0.0, reused=True))
        elif s.name == "teacher" or s.kind == "teacher":
            out.append(teacher_estimate(s.name, cfg.teacher, rows, rates))
        elif s.name == "augment":
            joined = joined_rows(cfg, rows)
            text = (f"{rows.labeled:,} labeled × {1 + a.variants_for(True)} + {rows.unlabeled:,} unlabeled × "
                    f"{1 + a.variants_for(False)}" + (f" + {joined:,} joined" if joined else "")
                    + f" = {transfer:,} (before dedup)")
            out.append(_pipeline(s.name, text, transfer, rates.augment_rows_s, rates.augment_fixed_s))
        elif s.name == "score":
            text = f"{transfer:,} rows" + (f" × {members} teachers" if members > 1 else "")
            out.append(_pipeline(s.name, text, transfer * members, rates.score_rows_s, rates.score_fixed_s * members))
        elif s.name == "dev.score":
            out.append(_pipeline(s.name, f"{rows.selection:,} rows", rows.selection * members, rates.score_rows_s,
                                 rates.score_fixed_s * members))
        elif s.name == "layer_texts":
            out.append(_pipeline(s.name, f"{rows.rest:,} rows", rows.rest, rates.augment_rows_s))
        elif s.name.startswith("students."):
            out.append(student_estimate(s.name, cfg.students[s.name.split(".", 1)[1]], transfer, rows, rates))
        elif s.name == "search" and cfg.search is not None:
            out.append(search_estimate(s.name, cfg.search, transfer, rows, rates, searched(cfg)))
        else:
            out.append(Estimate(s.name, "", None))
    return out


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
                 "the stages not estimated and the report's timing apart")
    lines += [f"  {e.stage}: {e.note}" for e in estimates if e.note]
    if cuts:
        lines.append(f"cut to fit budget_minutes: {'; '.join(cuts)}")
    if rates.load is not None and rates.cores and rates.load > rates.cores:
        lines.append(f"measured on a busy machine (load {rates.load:.1f} on {rates.cores} cores): the minutes may be "
                     "several times what the stages take once the other work ends"
                     + ("; the budget's cuts follow them" if cuts else ""))
    return lines
