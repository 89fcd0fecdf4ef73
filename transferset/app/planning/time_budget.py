"""The run's plan printed before its first stage (transferset/app/planning/estimate.py's minutes) and cut to fit
`budget_minutes`.

The cuts are made where the distilled student loses least per minute saved: each step of each lever (one epoch
fewer, variants per row cut by a fifth, unlabeled rows halved), declared by the stage kind whose work it sets
(StageKind.levers), has a cost in points of the distilled student's selection accuracy, measured on a newcomer's
proxy, 6,000 SST-2 rows at 2 cores (benchmarks/levers.py; docs/results.md, "Where should a budget's minutes go?");
the cheapest step per second saved is taken until the plan fits, then any step the budget can give back is given
back, the costliest first. No cut leaves a distilled student seeing fewer than MIN_SEEN times the labeled rows (rows
× epochs): below that it fell to the labels-only student's level (81.2 against 81.7 on selection), nor fewer
variants per labeled row than the augment kind's MIN_VARIANTS; a budget that cannot afford them is refused with the
minutes it needs. A cut that would change the key of a stage the run reuses is never made.

The plan is a forecast from seconds of calibration (off by a third on a busy machine) and counts every epoch early
stopping may skip: after each stage that ran, the run re-fits the stages still to run to the minutes then left
(Budget.refit: their levers from their values before any cut; a trainer's epoch kept when at least half of it fits),
and each stage runs within its share of them (a trainer's last epoch trains on the part of one the time left holds,
or the phase ends at the epoch after which another would end past it: transferset.runtime.deadline), the stages
after it counted as cut by each step worth fewer points than its own last planned one (Budget.share).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

from transferset.app.report.chosen import learned_from_labels_only
from transferset.app.planning.estimate import count_rows, current, estimate, plan_lines, report_estimate, total_seconds
from transferset.app.stages.plan import RunPlan
from transferset.app.stages.costs import Estimate, Lever, Rates, Rows, transfer_rows, with_limit
from transferset.app.stages.base import KINDS, StageDef, in_order
from transferset.app.stages.augment import MIN_VARIANTS
from transferset.app.stages.teacher import with_epochs
from transferset.app.stages.context import DataFiles
from transferset.config import RunConfig
from transferset.runtime import deadline, typed
from transferset.runtime.errors import ConfigError


MIN_SEEN = 4  # a distilled student sees at least this many times the labeled rows (transfer rows × epochs)


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The settings a budget may cut, each stage kind's own (StageKind.levers), in the kinds' order; a lever applied
    with None gives the setting back its value in `cfg`."""
    return [lv for kind in in_order(KINDS.values()) if kind.levers is not None for lv in kind.levers(cfg, stages, rows)]


def downstream(stages: Sequence[StageDef], names: Sequence[str]) -> set[str]:
    """`names` and every stage whose upstream chain holds one of them."""
    found = set(names)
    for s in stages:
        if found.intersection(s.upstream):
            found.add(s.name)
    return found


def sees_enough(cfg: RunConfig, rows: Rows) -> bool:
    """Whether every distilled student (one that reads the teacher's outputs) sees at least MIN_SEEN times the
    labeled rows: the transfer set's rows (before dedup) × its epochs."""
    seen = transfer_rows(cfg, with_limit(cfg, rows))
    return all(seen * s.epochs >= MIN_SEEN * rows.labeled for s in cfg.students.values()
               if not learned_from_labels_only(typed.to_dict(s)))


def fit(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows, rates: Rates, reused: set[str],
        budget_minutes: float, overhead_s: float = 0.0, strict: bool = True,
        below: float = math.inf, part: float = 0.0) -> tuple[RunConfig, list[str]]:
    """`cfg` cut to fit the budget, and the cuts in words: the step that costs the fewest points per second saved
    first (LOSS), none below MIN_SEEN (when `cfg` meets it), then each step the budget allows given back, the
    costliest first; refuses (ConfigError) when the smallest plan does not fit. A lever whose cut would change a
    reused stage's key is left as it is. `overhead_s`: what the run spends besides its stages, whatever the cuts (the
    calibration, the report's timing). Not `strict` (a run re-fitted mid-way): the smallest plan, not a refusal.
    `below`: only steps costing fewer points are taken (the smallest plan is then the one they reach). `part`: a
    trainer's epoch is given back when that part of it fits (its last epoch then trains on what the deadline holds:
    Lever.epochs)."""
    def seconds(c: RunConfig) -> float:
        return total_seconds(estimate(c, stages, rows, rates, reused)) + overhead_s

    budget, floor = budget_minutes * 60, sees_enough(cfg, rows)
    free = [lv for lv in levers(cfg, stages, rows) if lv.values and not downstream(stages, lv.stages) & reused]
    depth = {lv.name: -1 for lv in free}  # the index of each lever's value (-1: not cut)

    def at(d: dict[str, int]) -> RunConfig:
        c = cfg
        for lv in free:
            c = lv.apply(c, None if d[lv.name] < 0 else lv.values[d[lv.name]])
        return c

    def step_cost(lv: Lever, d: dict[str, int]) -> float:  # the points the lever's next step (from d) costs
        return lv.loss(lv.now if d[lv.name] < 0 else lv.values[d[lv.name]])

    now, blocked = seconds(cfg), False
    while now > budget:
        steps = []  # (points per second saved, the depths after the step, their seconds)
        for lv in (lv for lv in free if depth[lv.name] + 1 < len(lv.values) and step_cost(lv, depth) < below):
            deeper = {**depth, lv.name: depth[lv.name] + 1}
            c = at(deeper)
            if floor and not sees_enough(c, rows):
                blocked = True
                continue
            after = seconds(c)
            if after < now:
                steps.append((step_cost(lv, depth) / (now - after), deeper, after))
        if not steps:
            break
        _, depth, now = min(steps, key=lambda t: t[0])
    if now > budget and strict:
        raise ConfigError(_refusal(budget_minutes, _cuts(free, depth), now, blocked))
    def fits(back: dict[str, int], lv: Lever) -> bool:  # the step given back fits (an epoch's `part` of it does)
        more = seconds(at(back))
        over = more - budget
        return over <= 0 or (part > 0 and lv.epochs and over <= (1 - part) * (more - seconds(at(depth))))

    for lv in sorted(free, key=lambda lv: -step_cost(lv, {**depth, lv.name: depth[lv.name] - 1})):
        while depth[lv.name] >= 0 and fits({**depth, lv.name: depth[lv.name] - 1}, lv):
            depth = {**depth, lv.name: depth[lv.name] - 1}
    return at(depth), _cuts(free, depth)


def _cuts(free: Sequence[Lever], depth: dict[str, int]) -> list[str]:
    """The cuts at `depth` (each lever's index into its values, -1: not cut), in words."""
    return [f"{lv.name} {lv.now:,} → {lv.values[depth[lv.name]]:,}" for lv in free if depth[lv.name] >= 0]


def _refusal(budget_minutes: float, cuts: Sequence[str], seconds: float, blocked: bool) -> str:
    made = "; ".join(cuts) or "nothing it may cut"
    floor = (f"; a distilled student sees at least {MIN_SEEN} times the labeled rows (rows × epochs), below which it "
             "learned no more than the labels-only student" if blocked else "")
    if any(cut.startswith("augment.n_iter ") and cut.endswith(f"→ {MIN_VARIANTS}") for cut in cuts):
        floor += (f"; the variants per labeled row stay at {MIN_VARIANTS} or more, below which the distilled student "
                  "fell behind the labels-only one")
    return (f"budget_minutes={budget_minutes:g}: even the smallest plan ({made}) takes about {seconds / 60:.1f} "
            f"minutes on this machine{floor}: give at least {math.ceil(seconds / 60)}, or fewer rows")


Measure = Callable[[RunConfig, Rows, set[str]], Rates]


def clock() -> float:
    """The seconds a budget counts (time.monotonic; the tests stop it to plan as if no time passed)."""
    return time.monotonic()


def cut_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings a budget may cut, by name (unlabeled_limit None: every row)."""
    return {"augment.unlabeled_n_iter": cfg.augment.variants_for(False), "augment.n_iter": cfg.augment.n_iter,
            "unlabeled_limit": cfg.unlabeled_limit, "teacher.epochs": cfg.teacher.epochs,
            "teacher.optim.lr": cfg.teacher.optim.lr,
            **{f"students.{n}.epochs": s.epochs for n, s in cfg.students.items()},
            **({"search.rungs (the last)": cfg.search.rungs[-1]} if cfg.search is not None else {})}


def changes(cfg: RunConfig, cut: RunConfig) -> list[str]:
    """Each setting a budget may cut that differs between `cfg` and `cut`, in words ("teacher.epochs 3 → 1")."""
    before, after = cut_settings(cfg), cut_settings(cut)
    return [f"{k} {_shown(before[k])} → {_shown(after[k])}" for k in before if before[k] != after[k]]


def earlier_cut(cfg: RunConfig, earlier: Optional[RunConfig]) -> Optional[RunConfig]:
    """The config the last run in this folder ran when it is this one cut by the same budget (every setting a
    budget does not cut the same): a rerun keeps those cuts, since rates measured again on a busy machine differ and
    another cut would run its stages again."""
    if earlier is None or cfg.budget_minutes is None or earlier.budget_minutes != cfg.budget_minutes \
            or set(earlier.students) != set(cfg.students):
        return None
    e = earlier
    same = replace(cfg, augment=replace(cfg.augment, n_iter=e.augment.n_iter, unlabeled_n_iter=e.augment.unlabeled_n_iter),
                   unlabeled_limit=e.unlabeled_limit, teacher=with_epochs(cfg.teacher, e.teacher.epochs, cfg.teacher),
                   students={n: replace(s, epochs=e.students[n].epochs) for n, s in cfg.students.items()},
                   search=cfg.search and e.search and replace(cfg.search, rungs=e.search.rungs))
    return e if same == e else None


def shortfalls(cfg: RunConfig, cut: RunConfig, stages: Sequence[StageDef], rows: Rows, rates: Rates,
               reused: set[str], overhead_s: float) -> list[str]:
    """A warning for each lever the cut took below what its stage kind says the run needs to pay (Lever.needs),
    with the budget that would keep that value (the other cuts as they are)."""
    got = {lv.name: lv.now for lv in levers(cut, stages, rows)}
    out = []
    for lv in levers(cfg, stages, rows):
        value = got.get(lv.name, lv.now)
        if lv.needs is None or value >= lv.needs or lv.now < lv.needs:
            continue
        kept = lv.apply(cut, lv.needs)
        minutes = (total_seconds(estimate(kept, stages, rows, rates, reused)) + overhead_s) / 60
        out.append(f"warning: the budget cut {lv.name} to {value:,} (below {lv.needs:,}): {lv.why}; "
                   f"--budget-minutes {math.ceil(minutes)} keeps {lv.needs:,}")
    return out


def overhead_estimates(cfg: RunConfig, plan: RunPlan, rows: Rows, rates: Rates) -> list[Estimate]:
    """What a run spends besides its stages, which no cut changes: the calibration just spent, and the report's
    timing of every model."""
    return [Estimate("calibration", "measured before this plan", rates.seconds),
            report_estimate([*plan.outputs.models(), *(f"teacher {k}" for k in range(1, len(plan.outputs.members)))],
                            rows.selection, cfg.report, rates)]


def plan_time(cfg: RunConfig, files: DataFiles, replan: Callable[[RunConfig], RunPlan],
              data_dir: Optional[str], measure: Measure, log: Callable[[str], None],
              earlier: Optional[RunConfig] = None) -> tuple[RunConfig, Optional[Budget]]:
    """Print the plan (rows and minutes of each stage) and return the config cut to fit `budget_minutes`, with what
    the run re-fits the stages still to run by (None without a budget); refuse the run (ConfigError) after the plan
    when a stage's probe says it cannot succeed. `replan(cfg)`: the run's plan (stages and outputs); `measure(cfg,
    rows, will_run)`: the rates of the stages that will run (calibrate.measure_rates); `earlier`: the config the last
    run in the folder recorded (earlier_cut)."""
    began = clock()
    start = earlier_cut(cfg, earlier) or cfg
    plan = replan(start)
    stages = plan.stages
    reused = current(stages)
    rows = count_rows(start, files, data_dir, "data" in reused and data_dir is not None)
    rates = measure(start, rows, {s.name for s in stages} - reused)
    # a stage that can measure its own work before it runs (the search: its candidates timed untrained)
    probed = {s.name: s.probe(set(s.upstream) <= reused, rows.sample) for s in stages
              if s.probe is not None and s.name not in reused}
    rates = replace(rates, probed={name: got for name, got in probed.items() if got is not None})
    overhead = overhead_estimates(start, plan, rows, rates)
    cut = start
    if cfg.budget_minutes is not None:
        cut, _ = fit(start, stages, rows, rates, reused, cfg.budget_minutes, total_seconds(overhead))
    cuts = changes(cfg, cut)
    for line in plan_lines([overhead[0], *estimate(cut, stages, rows, rates, reused), overhead[1]], rates, cuts):
        log(line)
    for line in shortfalls(start, cut, stages, rows, rates, reused, total_seconds(overhead)):
        log(line)
    refused = [got["refuse"] for got in rates.probed.values() if got.get("refuse")]
    if refused:  # what a stage's probe measured says it cannot succeed (the search: no variant in budget)
        raise ConfigError(refused[0])
    if cfg.budget_minutes is None:
        return cut, None
    return cut, Budget(start, stages, rows, rates, total_seconds(overhead[1:]), cfg.budget_minutes * 60, began)


@dataclass(frozen=True)
class Budget:
    """What the plan measured, kept so that the run re-fits the stages still to run to the minutes left after each
    stage that ran (a calibration off by a third, or a stage that stopped early, moves what the rest may take), and
    gives the stage about to run its share of them (transferset.runtime.deadline)."""

    start: RunConfig  # the config before any cut: a lever still free may go back up to its value here
    stages: Sequence[StageDef]
    rows: Rows
    rates: Rates
    after_s: float  # what the run spends after its stages (the report's timing), as estimated
    seconds: float  # the whole budget
    began: float  # clock() when the plan began, before the calibration

    def left(self) -> float:
        """The budget's seconds not yet spent."""
        return self.seconds - (clock() - self.began)

    def refit(self, cut: RunConfig, done: set[str]) -> tuple[RunConfig, list[str]]:
        """`cut` with the levers of the stages not yet run (none of `done` downstream) fitted afresh to the seconds
        left, from their values before any cut; the smallest plan when even that does not fit."""
        base = cut
        for lv in levers(self.start, self.stages, self.rows):
            if lv.values and not downstream(self.stages, lv.stages) & done:
                base = lv.apply(base, None)
        return fit(base, self.stages, self.rows, self.rates, done, self.left() / 60, self.after_s, strict=False,
                   part=deadline.MIN_PART)

    def share(self, cfg: RunConfig, done: set[str], name: str) -> float:
        """The seconds stage `name` may take: those left, less what the report and the stages after it will take once
        cut by every step that costs fewer points than the stage's own last planned step is worth (`worth`): a
        teacher slower than its plan still gets its second epoch (3.7 points) from the students' later epochs and
        the variants (1.0 and less each), which the re-fit after it then cuts; a step worth no more than theirs
        (a student's fourth epoch) does not."""
        rest, _ = fit(cfg, self.stages, self.rows, self.rates, done | {name}, 0.0, strict=False,
                      below=self.worth(cfg, name))
        return self.left() - total_seconds(estimate(rest, self.stages, self.rows, self.rates, done | {name})) \
            - self.after_s

    def worth(self, cfg: RunConfig, name: str) -> float:
        """The points the last planned step of stage `name`'s own levers is worth (LOSS of cutting it; 0: none)."""
        return max((lv.loss(lv.now) for lv in levers(cfg, self.stages, self.rows) if lv.values and name in lv.stages),
                   default=0.0)


def _shown(value: Any) -> str:
    return "every row" if value is None else f"{value:,}"
