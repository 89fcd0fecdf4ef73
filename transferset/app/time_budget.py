"""The run's plan printed before its first stage (transferset/app/estimate.py's minutes) and cut to fit
`budget_minutes`.

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

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

from transferset.app.estimate import Rates, Rows, count_rows, current, estimate, plan_lines, total_seconds
from transferset.app.stages import StageDef
from transferset.app.stages.context import DataFiles, splits_train
from transferset.config import RunConfig
from transferset.runtime.errors import ConfigError


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
    cuts made; refuse the run (ConfigError) after the plan when a stage's probe says it cannot succeed.
    `replan(cfg)`: the run's stages; `measure(cfg, rows, will_run)`: the rates of the stages that will run
    (calibrate.measure_rates); `earlier`: the config the last run in the folder recorded (earlier_cut)."""
    start = earlier_cut(cfg, earlier) or cfg
    stages = replan(start)
    reused = current(stages)
    rows = count_rows(start, files, data_dir, "data" in reused and data_dir is not None)
    rates = measure(start, rows, {s.name for s in stages} - reused)
    # a stage that can measure its own work before it runs (the search: its candidates timed untrained)
    probed = {s.name: s.probe(set(s.upstream) <= reused, rows.sample) for s in stages
              if s.probe is not None and s.name not in reused}
    rates = replace(rates, probed={name: got for name, got in probed.items() if got is not None})
    cut = start
    if cfg.budget_minutes is not None:
        cut, _ = fit(start, stages, rows, rates, reused, cfg.budget_minutes)
    before, after = cut_settings(cfg), cut_settings(cut)
    cuts = [f"{k} {_shown(before[k])} → {_shown(after[k])}" for k in before if before[k] != after[k]]
    for line in plan_lines(estimate(cut, stages, rows, rates, reused), rates, cuts):
        log(line)
    refused = [got["refuse"] for got in rates.probed.values() if got.get("refuse")]
    if refused:  # what a stage's probe measured says it cannot succeed (the search: no variant in budget)
        raise ConfigError(refused[0])
    return cut, cuts


def _shown(value: Any) -> str:
    return "every row" if value is None else f"{value:,}"
