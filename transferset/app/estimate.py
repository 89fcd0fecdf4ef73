"""The run's own time, planned before its first stage: each stage's rows and its minutes on this machine, from
rates a few seconds of calibration measure (transferset/app/calibrate.py), and the plan cut to fit `budget_minutes`.

Rows are counted before anything runs: the labeled and unlabeled pools as the data stage will make them (its
split.json when that stage is current, else the train file counted as data/splits.py splits it); the transfer set
is labeled × (1 + n_iter) + unlabeled × (1 + unlabeled_n_iter), before dedup; each student trains its phases'
rows × epochs. Both are at most: dedup drops copies and early stopping ends a phase sooner. A stage whose folder
holds its current key is reused and costs nothing.

Cuts, in this order, each only as deep as the budget needs before the next is touched (and, once the plan fits,
each earlier cut given back as far as the budget allows: a deep later cut may make it needless):
1. augment.unlabeled_n_iter, halved down to 0
2. augment.n_iter, halved down to 1
3. every student's epochs, one at a time down to 1
4. the search's last rung (`search.rungs`), one epoch at a time down to one more than the rung before
5. the unlabeled rows (unlabeled_limit), halved down to 0
6. teacher.epochs, one at a time down to 1
Variants go first (real in-domain text pays more than variants of it), the teacher last (everything downstream
learns from it). A cut that would change the key of a stage the run reuses is never made.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence

from students.losses import LossWeights
from students.schedules import phases
from transferset import fs
from transferset.app.stages import Stage, StageDef
from transferset.app.stages.context import DataFiles, splits_train
from transferset.app.stages.search import candidate_configs, rung_sizes
from transferset.config import RunConfig
from transferset.data.splits import SPLIT_STATS_FILE, validation_rows
from transferset.runtime.errors import ConfigError, UserError
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


@dataclass(frozen=True)
class Estimate:
    stage: str
    rows: str  # the rows, as arithmetic
    seconds: Optional[float]  # None: not estimated
    reused: bool = False


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
    """The transfer set before dedup: each row and its variants."""
    a = cfg.augment
    return rows.labeled * (1 + a.variants_for(True)) + rows.unlabeled * (1 + a.variants_for(False))


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


def search_estimate(name: str, sc, transfer: int, rows: Rows, rates: Rates) -> Estimate:
    """Each rung's candidates × its epochs, the slowest counted (the timing drops some, unknown before): at most."""
    configs = candidate_configs(sc)
    sizes = rung_sizes(len(configs), sc.rungs, sc.keep)
    text = f"{len(configs)} candidates, before the budget's timing drops any; " + ", ".join(
        f"{n} × {e} epochs" for n, e in zip(sizes, sc.rungs))
    cost: dict[int, list[float]] = {}
    for c, s_cfg in configs.items():
        for epochs in sc.rungs:
            e = student_estimate(name, replace(s_cfg, epochs=epochs), transfer, rows, rates, key=f"search.{c}")
            if e.seconds is None:
                return Estimate(name, f"{text} ({c} not calibrated)", None)
            cost.setdefault(epochs, []).append(e.seconds + exits_seconds(s_cfg, sc, transfer, rates, f"search.{c}"))
    timing = sum(rates.student_fixed_s.get(f"search.{c}", 0.0) for c in configs)
    return Estimate(name, text, timing + sum(sum(sorted(cost[e])[-n:]) for n, e in zip(sizes, sc.rungs)))


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
            text = (f"{rows.labeled:,} labeled × {1 + a.variants_for(True)} + {rows.unlabeled:,} unlabeled × "
                    f"{1 + a.variants_for(False)} = {transfer:,} (before dedup)")
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
            out.append(search_estimate(s.name, cfg.search, transfer, rows, rates))
        else:
            out.append(Estimate(s.name, "", None))
    return out


def total_seconds(estimates: Sequence[Estimate]) -> float:
    return sum(e.seconds or 0.0 for e in estimates)


# --- the budget ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lever:
    """One setting a budget may cut: its values from the mildest cut to the deepest, and how a config takes one."""

    name: str
    now: Any
    values: list[Any]
    apply: Callable[[RunConfig, Any], RunConfig]
    stages: tuple[str, ...]  # the stages whose keys the cut changes (theirs and every stage after them)


def halvings(value: int, floor: int) -> list[int]:
    """value // 2, value // 4, ... down to floor (each once)."""
    out: list[int] = []
    while value > floor:
        value = max(floor, value // 2)
        out.append(value)
    return out


def _augment(key: str, original: Any) -> Callable[[RunConfig, Any], RunConfig]:
    return lambda c, v: replace(c, augment=replace(c.augment, **{key: original if v is None else v}))


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The cuts, in the order they are made (the module's docstring says why); a lever applied with None gives the
    setting back its value in `cfg`."""
    a = cfg.augment
    names = [s.name for s in stages]
    trained = tuple(s.name for s in stages if s.run is not None and (s.name == "teacher" or s.kind == "teacher"))
    students = tuple(n for n in names if n.startswith("students."))
    given = {n: s.epochs for n, s in cfg.students.items()}
    epochs = max(given.values(), default=1)

    def student_epochs(c: RunConfig, e: Optional[int]) -> RunConfig:
        return replace(c, students={n: replace(s, epochs=given[n] if e is None else min(given[n], e))
                                    for n, s in c.students.items()})

    out = [Lever("augment.unlabeled_n_iter", a.variants_for(False), halvings(a.variants_for(False), 0),
                 _augment("unlabeled_n_iter", a.unlabeled_n_iter), ("augment",)),
           Lever("augment.n_iter", a.n_iter, halvings(a.n_iter, 1), _augment("n_iter", a.n_iter), ("augment",)),
           Lever("students' epochs", epochs, list(range(epochs - 1, 0, -1)), student_epochs, students)]
    if cfg.search is not None and "search" in names:
        rungs = cfg.search.rungs
        out.append(Lever("search's last rung", rungs[-1], list(range(rungs[-1] - 1, rungs[-2] if len(rungs) > 1 else 0,
                                                                     -1)),
                         lambda c, v: replace(c, search=replace(c.search, rungs=(*rungs[:-1], v or rungs[-1]))),
                         ("search",)))
    if splits_train(cfg) and rows.unlabeled:
        out.append(Lever("unlabeled rows", rows.unlabeled, halvings(rows.unlabeled, 0),
                         lambda c, v: replace(c, unlabeled_limit=cfg.unlabeled_limit if v is None else v), ("data",)))
    if trained:
        out.append(Lever("teacher.epochs", cfg.teacher.epochs, list(range(cfg.teacher.epochs - 1, 0, -1)),
                         lambda c, v: replace(c, teacher=replace(c.teacher, epochs=cfg.teacher.epochs if v is None
                                                                 else v)), trained))
    return out


def downstream(stages: Sequence[StageDef], names: Sequence[str]) -> set[str]:
    """`names` and every stage whose upstream chain holds one of them."""
    found = set(names)
    for s in stages:
        if found.intersection(s.upstream):
            found.add(s.name)
    return found


def fit(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows, rates: Rates, reused: set[str],
        budget_minutes: float) -> tuple[RunConfig, list[str]]:
    """`cfg` cut to fit the budget, and each cut as first made in words (plan_time says the cuts that stay);
    refuses (ConfigError) when the smallest plan does not fit. A lever whose cut would change a reused stage's key
    is left as it is."""
    def seconds(c: RunConfig) -> float:
        return total_seconds(estimate(c, stages, rows, rates, reused))

    budget = budget_minutes * 60
    cuts: list[str] = []
    used: list[Lever] = []
    for lever in levers(cfg, stages, rows):
        if seconds(cfg) <= budget:
            break
        if not lever.values or downstream(stages, lever.stages) & reused:
            continue
        chosen = next((v for v in lever.values if seconds(lever.apply(cfg, v)) <= budget), lever.values[-1])
        cfg = lever.apply(cfg, chosen)
        cuts.append(f"{lever.name} {lever.now:,} → {chosen:,}")
        used.append(lever)
    if seconds(cfg) <= budget:
        # a later, deeper cut may have made an earlier one needless: give each back as much as the budget allows,
        # the one cut last first (the later a lever comes in the order, the more it is worth)
        for lever in reversed(used[:-1]):
            cfg = next(c for c in (*(lever.apply(cfg, v) for v in (None, *lever.values)), cfg) if seconds(c) <= budget)
        return cfg, cuts
    made = "; ".join(cuts) or "nothing it may cut"
    raise ConfigError(f"budget_minutes={budget_minutes:g}: even the smallest plan ({made}) takes about "
                      f"{seconds(cfg) / 60:.1f} minutes on this machine: give at least {math.ceil(seconds(cfg) / 60)}, "
                      "or fewer rows")


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
    if cuts:
        lines.append(f"cut to fit budget_minutes: {'; '.join(cuts)}")
    if rates.load is not None and rates.cores and rates.load > rates.cores:
        lines.append(f"measured on a busy machine (load {rates.load:.1f} on {rates.cores} cores): the minutes may be "
                     "several times what the stages take once the other work ends"
                     + ("; the budget's cuts follow them" if cuts else ""))
    return lines


Measure = Callable[[RunConfig, Rows, set[str]], Rates]


def cut_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings a budget may cut, by name, in the order it cuts them (unlabeled_limit None: every row)."""
    return {"augment.unlabeled_n_iter": cfg.augment.variants_for(False), "augment.n_iter": cfg.augment.n_iter,
            "unlabeled_limit": cfg.unlabeled_limit, "teacher.epochs": cfg.teacher.epochs,
            **{f"students.{n}.epochs": s.epochs for n, s in cfg.students.items()},
            **({"search.rungs (the last)": cfg.search.rungs[-1]} if cfg.search is not None else {})}


def earlier_cut(cfg: RunConfig, earlier: Optional[RunConfig]) -> Optional[RunConfig]:
    """The config the last run in this folder ran when it is this one cut by the same budget (every setting a
    budget does not cut the same): a rerun keeps those cuts, since rates measured again on a busy machine differ and
    another cut would run its stages again."""
    if earlier is None or cfg.budget_minutes is None or earlier.budget_minutes != cfg.budget_minutes \
            or set(earlier.students) != set(cfg.students):
        return None
    e = earlier
    same = replace(cfg, augment=replace(cfg.augment, n_iter=e.augment.n_iter, unlabeled_n_iter=e.augment.unlabeled_n_iter),
                   unlabeled_limit=e.unlabeled_limit, teacher=replace(cfg.teacher, epochs=e.teacher.epochs),
                   students={n: replace(s, epochs=e.students[n].epochs) for n, s in cfg.students.items()},
                   search=cfg.search and e.search and replace(cfg.search, rungs=e.search.rungs))
    return e if same == e else None


def plan_time(cfg: RunConfig, files: DataFiles, replan: Callable[[RunConfig], Sequence[StageDef]],
              data_dir: Optional[str], measure: Measure, log: Callable[[str], None],
              earlier: Optional[RunConfig] = None) -> tuple[RunConfig, list[str]]:
    """Print the plan (rows and minutes of each stage) and return the config cut to fit `budget_minutes` with the
    cuts made. `replan(cfg)`: the run's stages; `measure(cfg, rows, will_run)`: the rates of the stages that will run
    (calibrate.measure_rates); `earlier`: the config the last run in the folder recorded (earlier_cut)."""
    start = earlier_cut(cfg, earlier) or cfg
    stages = replan(start)
    reused = current(stages)
    rows = count_rows(start, files, data_dir, "data" in reused and data_dir is not None)
    rates = measure(start, rows, {s.name for s in stages} - reused)
    cut = start
    if cfg.budget_minutes is not None:
        cut, _ = fit(start, stages, rows, rates, reused, cfg.budget_minutes)
    before, after = cut_settings(cfg), cut_settings(cut)
    cuts = [f"{k} {_shown(before[k])} → {_shown(after[k])}" for k in before if before[k] != after[k]]
    for line in plan_lines(estimate(cut, stages, rows, rates, reused), rates, cuts):
        log(line)
    return cut, cuts


def _shown(value: Any) -> str:
    return "every row" if value is None else f"{value:,}"
