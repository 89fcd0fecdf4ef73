"""What a stage's estimate reads and gives (`StageDef.estimate`): the rows the run's stages read, counted before
they run; the rates the calibration measured on this machine (transferset/app/planning/calibrate.py); one stage's rows and
seconds. Each stage kind estimates its own stages from a `Costing`; transferset/app/planning/estimate.py counts the rows and
prints the plan, transferset/app/planning/time_budget.py cuts it.

The transfer set is labeled × (1 + n_iter) + unlabeled × (1 + unlabeled_n_iter) (+ the rows the join op makes),
before dedup: at most, as every figure here is (dedup drops copies and early stopping ends a phase sooner).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from transferset.augment import join
from transferset.config import RunConfig

BEAM_START_S = 3.0  # a local Beam pipeline's start and finish (FnApiRunner, 2 workers): assumed, not measured


@dataclass(frozen=True)
class Rows:
    """The rows the run's stages read, counted before they run."""

    labeled: int
    unlabeled: int
    selection: int
    rest: int = 0  # train rows no pool takes (a student's `layer_texts: rest`)
    sample: tuple[str, ...] = ()  # the first train texts, for the calibration
    test: int = 0  # the test split's rows (scored once by every model at the end)


@dataclass(frozen=True)
class Rates:
    """What the calibration measured on this machine (None: not measured, the stage is not estimated)."""

    teacher_step_s: Optional[float] = None  # one optimizer step at teacher.batch_size and max_length
    score_rows_s: Optional[float] = None  # rows the teacher scores per second (scoring, its evaluation)
    # rows per second of the teacher at fp32, as the test stage and the report run it and its export (None: the
    # scoring rate, where scoring runs at fp32 too)
    fp32_rows_s: Optional[float] = None
    teacher_row_s: Optional[float] = None  # seconds a row of the teacher at fp32 takes on one thread (the report's timing)
    augment_rows_s: Optional[float] = None  # transfer rows made per second (contexts and variants), in process
    student_step_s: dict[str, float] = field(default_factory=dict)  # one step at the student's batch_size
    teacher_fixed_s: float = 0.0  # a teacher stage's own start and end: loading the model, saving it
    teacher_epoch_s: float = 0.0  # each epoch's checkpoint (weights and optimizer state)
    score_fixed_s: float = 0.0  # a score stage's teacher, loaded and made ready in its worker
    augment_fixed_s: float = 0.0  # the augment ops' models (a POS tagger, an MLM), loaded
    student_fixed_s: dict[str, float] = field(default_factory=dict)  # a student built, and its latency timed
    tokenize_rows_s: Optional[float] = None  # rows tokenized per second (a vocabulary made from the transfer set)
    teacher_parameters: Optional[int] = None  # the teacher's parameters (its export's size)
    measured: str = ""  # what was measured, in words
    load: Optional[float] = None  # the machine's 1-minute load average when the calibration began
    cores: Optional[int] = None  # the cores this process may use
    seconds: float = 0.0  # what the calibration itself took (spent before the first stage: the plan counts it)
    probed: dict[str, Any] = field(default_factory=dict)  # by stage: what its probe measured (StageDef.probe)


def fp32_rate(rates: Rates) -> Optional[float]:
    """The teacher's rows per second at fp32 (Rates.fp32_rows_s), the scoring rate where it was not measured apart."""
    return rates.fp32_rows_s or rates.score_rows_s


# A teacher's export (its ONNX, int8, pruned or early-exit model) against the teacher's padding-free forward, row for
# row, where the test stage and the report run it: the ONNX export pads each batch to its longest row (on the long
# proxy, ~70 tokens a row: 41 against 20 ms a row at batch 64 on one thread, 17 against 20 at batch 1).
EXPORT_TIMING = 1.9


def made_from_teacher(name: str) -> bool:
    """Whether a model, by its name in the run (RunOutputs.models), is one the run made from the teacher (its export,
    int8, pruned or early-exit model): not the teacher, nor an ensemble's member ("teacher K")."""
    return name.startswith("teacher") and name != "teacher" and not (name.startswith("teacher ") and name[8:].isdigit())


def teacher_weight(name: str) -> float:
    """A model's time against the teacher's, by its name in the run (RunOutputs.models): EXPORT_TIMING for a model
    made from the teacher, 1 for the teacher and an ensemble's members, 0 for a student (counted apart)."""
    return EXPORT_TIMING if made_from_teacher(name) else 1.0 if name.startswith("teacher") else 0.0


@dataclass(frozen=True)
class Estimate:
    stage: str
    rows: str  # the rows, as arithmetic
    seconds: Optional[float]  # None: not estimated
    reused: bool = False
    note: str = ""  # what the plan says of the stage below its table (the search's candidates the teacher cannot give)


@dataclass(frozen=True)
class Costing:
    """What a stage's estimate reads: the config as the budget may have cut it (a stage's estimate reads its settings
    from here, not from the config its stage was built with), the rows under its unlabeled_limit, the rates."""

    cfg: RunConfig
    rows: Rows
    rates: Rates

    @property
    def transfer(self) -> int:
        return transfer_rows(self.cfg, self.rows)

    @property
    def members(self) -> int:
        """The teachers that score each row (an ensemble's members, else 1)."""
        return len(self.cfg.teacher_paths or self.cfg.teacher_seeds or [None])


def pipeline_estimate(name: str, text: str, n: int, rate: Optional[float], fixed: float = 0.0) -> Estimate:
    """A Beam pipeline's stage: its start, `fixed` seconds, and n rows at `rate` rows per second."""
    return Estimate(name, text, None if rate is None else BEAM_START_S + fixed + n / rate)


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


@dataclass(frozen=True)
class Lever:
    """One setting a budget may cut (transferset/app/planning/time_budget.py), declared by the stage kind whose work it sets
    (StageKind.levers): its values from the mildest cut to the deepest, how a config takes one, and what a step
    costs in points of the distilled student's selection accuracy."""

    name: str
    now: Any
    values: list[Any]
    apply: Callable[[RunConfig, Any], RunConfig]  # the config with the value; None gives back the config's own
    stages: tuple[str, ...]  # the stages whose keys the cut changes (theirs and every stage after them)
    loss: Callable[[Any], float]  # the points a step costs, by the value it cuts from (the value one step milder)
    # the least value at which the run is likely to pay, and why: a plan cut below it warns, with the budget that
    # would keep it (time_budget.shortfalls); None: any value the cut allows
    needs: Any = None
    why: str = ""
    # a trainer's epochs: under the budget's deadline its last epoch trains on the part of one the time left holds
    # (transferset.runtime.deadline), so a re-fitted plan keeps an epoch of which at least MIN_PART fits
    epochs: bool = False


def halvings(value: int, floor: int) -> list[int]:
    """value // 2, value // 4, ... down to floor (each once)."""
    out: list[int] = []
    while value > floor:
        value = max(floor, value // 2)
        out.append(value)
    return out


def steps(value: int, floor: int, ratio: float = 0.8) -> list[int]:
    """value cut in finer steps than halvings (20, 16, 13, 10, 8, 6, 5, 4, ...): each about `ratio` of the one
    before and at least one less, down to floor, so a budget's cut can stop nearer what it affords."""
    out: list[int] = []
    while value > floor:
        value = max(floor, min(value - 1, round(value * ratio)))
        out.append(value)
    return out


def halving_loss(now: int, values: Sequence[int], points: float) -> Callable[[Any], float]:
    """A Lever's loss for a cut through `values` (from `now`) that costs `points` per halving: a step from v to w
    costs points × log2(v / w), a cut to 0 one halving."""
    after = dict(zip([now, *values], values))

    def loss(v: Any) -> float:
        w = after.get(v, 0)
        return points if w == 0 else points * math.log2(v / w)
    return loss


def epoch_loss(first: float, second: float) -> Callable[[Any], float]:
    """The points an epoch fewer costs, cutting from `e` epochs: `first` for the second epoch (2 → 1), `second` for
    the third, then less for each later one (second / (e - 2)): the curves of benchmarks/levers.py."""
    return lambda e: first if e <= 2 else second / (e - 2)
