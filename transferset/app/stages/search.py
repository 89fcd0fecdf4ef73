"""The search stage (`search:`, or `run --budget-ms / --budget-mb / --budget-speedup`): the most accurate student
under a budget. Every candidate trains from the run's one scored set, so trying one costs minutes, not a teacher
pass.

0. The candidates, and early-exit variants, that the run's teacher cannot give (a transformer cut deeper than it is,
   exits it cannot take, pkd on layers the scored set will not hold) are dropped before the first stage, and the
   plan says which (search_space.py); with none left the run is refused (exit 2).
1. Each candidate is built untrained and timed as the report times models (CPU ms per example at batch 1 on one
   thread, tokenization included), and its saved size measured; with `int8` (the default) its int8 ONNX export
   too, as a variant of its own (NAME+int8), and with `exit_speeds` (the default) a transformer's early exits at
   each speed (NAME+exits@S, PyTorch: exits do not export), timed at their lower bound, every row leaving at the
   first branch. Those over budget are dropped before any training. The plan times them the same way
   (search_timing.py), so it counts those in budget, and refuses a budget none meets before the first stage (exit 2,
   naming the closest).
2. Successive halving on the selection split: every candidate left trains `rungs[0]` epochs, the best `keep` of
   them train `rungs[1]` epochs, and so on; the best of the last rung is chosen (of two alike, the faster). The
   test split chooses nothing.
   Each (candidate, rung) is a normal student folder, search/candidates/NAME-eE, keyed as a student stage is (its
   settings and the scored sets' keys): a killed search goes on, and another budget reuses what one trained. An
   int8 variant trains as its candidate (the same folder) and is exported beside it (NAME-eE-int8), its selection
   accuracy measured on that export; an early-exit variant's exits train beside it (NAME-eE-exits, for every
   speed), its accuracy and latency measured at its speed: over budget as trained, it stops.
3. The chosen student is copied to search/chosen, tested and reported with the run's other models as `search`;
   search/search.json says, for each candidate, its latency, size, accuracy at each rung and why it stopped.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence

from students.families.exits import write_speed
from transferset import fs
from transferset.app.report.latency import ONNX_RUNTIME, model_latency
from transferset.app.report.outputs import SEARCH_STUDENT
from transferset.app.report.search import latency_at
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import Stage, StageDef, StageKind, register, stage_key
from transferset.app.stages.context import Run
from transferset.app.stages.search_space import Space, teacher_gives
from transferset.app.stages.search_timing import (EXITS, INT8, int8_export, probe, timed_untrained,
                                                  timing_texts)
from transferset.app.stages.costs import Estimate, Lever, Rates, Rows
from transferset.app.stages.students import (EPOCH_LOSS, student_estimate, student_settings, vectors_seconds,
                                             with_run_teacher)
from transferset.config import ExitsConfig, RunConfig, StudentConfig
from transferset.config.search import SearchConfig
from transferset.contract import schema
from transferset.data import card
from transferset.runtime import timing, typed
from transferset.runtime.errors import ConfigError, UserError

NAME = SEARCH_STUDENT  # the chosen student's name among the run's models
INT8_FOLDER = "-int8"  # beside a trained candidate's folder: its int8 export
EXITS_FOLDER = "-exits"  # beside a trained candidate's folder: it with its exits (one training for every speed)
SEARCH_FILE = "search.json"  # in RUN/search/: every candidate, what it measured and why it stopped
CHOSEN_DIR = "chosen"


def rung_sizes(candidates: int, rungs: Sequence[int], keep: float) -> list[int]:
    """How many candidates train at each rung: all of them, then the best `keep` of those before (at least one)."""
    sizes = []
    for _ in rungs:
        sizes.append(candidates)
        candidates = max(1, math.ceil(candidates * keep))
    return sizes


def over_budget(entry: dict, sc: SearchConfig, teacher_ms: Optional[float]) -> list[str]:
    """Why a timed candidate cannot ship under the budget (empty: it can)."""
    why = []
    if sc.budget_ms is not None and entry["latency_1"] > sc.budget_ms:
        why.append(f"{entry['latency_1']:.3g} ms > {sc.budget_ms:g} ms")
    if sc.budget_mb is not None and entry["mb"] > sc.budget_mb:
        why.append(f"{entry['mb']:.3g} MB > {sc.budget_mb:g} MB")
    if sc.budget_speedup is not None and teacher_ms is not None and teacher_ms / entry["latency_1"] < sc.budget_speedup:
        why.append(f"{teacher_ms / entry['latency_1']:.3g}x the teacher's speed < {sc.budget_speedup:g}x")
    return why


def closest(timed: dict[str, dict], sc: SearchConfig) -> str:
    """The candidate nearest the budget: the smallest of its worst ratio to each bound."""
    def worst(e: dict) -> float:
        ratios = []
        if sc.budget_ms is not None:
            ratios.append(e["latency_1"] / sc.budget_ms)
        if sc.budget_mb is not None:
            ratios.append(e["mb"] / sc.budget_mb)
        if sc.budget_speedup is not None and e.get("teacher_ms"):
            ratios.append(sc.budget_speedup * e["latency_1"] / e["teacher_ms"])
        return max(ratios, default=1.0)
    return min(timed, key=lambda n: worst(timed[n]))


def candidate_configs(sc: SearchConfig) -> dict[str, StudentConfig]:
    """Each candidate's settings, typed and checked as a student's are (a bad one is refused before any stage)."""
    return {name: typed.load(StudentConfig, settings, where=f"search.space.{name}")
            for name, settings in sc.candidates().items()}


def searched(cfg: RunConfig) -> Space:
    """The run's candidates the search times and trains: those its teacher can give (search_space.py)."""
    return teacher_gives(cfg, candidate_configs(cfg.search))


def none_in_budget(timed: dict[str, dict], sc: SearchConfig, how: str = "", busy: str = "") -> str:
    """The refusal of a budget that none of the timed variants meets, naming the closest and how far it is."""
    near = closest({n: e for n, e in timed.items() if "refused" not in e}, sc)
    return (f"search: no candidate meets the budget{how}; the closest is {near} "
            f"({'; '.join(over_budget(timed[near], sc, timed[near]['teacher_ms']))}{busy}): raise the budget or add "
            "smaller candidates")


def base_of(variant: str) -> str:
    """The candidate a variant trains as (an int8 variant is its candidate, trained, then exported quantized; an
    early-exit variant its candidate, trained, then its exits trained beside it)."""
    if variant.endswith(INT8):
        return variant[:-len(INT8)]
    return variant.rsplit(EXITS, 1)[0]


def in_budget(timed: dict[str, dict], sc: SearchConfig) -> list[str]:
    """The timed variants the budget keeps."""
    return [n for n, e in timed.items() if "refused" not in e and not over_budget(e, sc, e["teacher_ms"])]


def train_rung(r: Run, out: RunOutputs, variant: str, cfg: StudentConfig, epochs: int, upstream: list[str],
               entry: dict, log) -> Optional[str]:
    """A variant's candidate trained `epochs` epochs: a student folder keyed as the students' stages are
    (`upstream`: the scored sets' keys), shared by the candidate's variants; an int8 variant's export of it, or an
    early-exit variant's exits, beside it (keyed by the student's). The variant's model folder and selection
    accuracy go in `entry` → why it stops at this rung (None: it goes on)."""
    name, cfg = base_of(variant), replace(cfg, epochs=epochs)
    folder = r.path("search", "candidates", f"{name}-e{epochs}")
    key = stage_key("student", student_settings(r.rules, cfg), upstream)
    Stage(f"search.{name}.e{epochs}", folder, key, schema.COMPLETE_MARKER, local=True).run(
        lambda work: r.fn.student(with_run_teacher(cfg, out), out.scored, out.dev_scored, work, overwrite=True), log)
    accuracy = entry.setdefault("selection_accuracy", {})
    if variant == name:
        entry["folder"] = folder
        accuracy[f"{epochs} epochs"] = fs.read_json(fs.join(folder, schema.METRICS_FILE))["dev_accuracy"]
        return None
    if EXITS in variant:
        return exits_rung(r, out, variant, cfg, folder, key, entry, log)
    quantized, why = folder + INT8_FOLDER, []
    Stage(f"search.{variant}.e{epochs}", quantized, stage_key("search.int8", {"quantize": "int8"}, [key]),
          schema.COMPLETE_MARKER, local=True).run(lambda work: why.append(int8_export(r, folder, work)), log)
    entry["folder"] = quantized
    if any(why):
        accuracy[f"{epochs} epochs"] = None
        return "the trained model's int8 export was refused"
    accuracy[f"{epochs} epochs"] = r.fn.evaluate(quantized, out.selection, **r.augment.column_kwargs())["accuracy"]
    return None


def exits_rung(r: Run, out: RunOutputs, variant: str, cfg: StudentConfig, folder: str, key: str, entry: dict,
               log) -> Optional[str]:
    """An early-exit variant at a rung: the trained candidate's exits (`transferset exits`, on its own outputs over
    the scored set; one training for every speed), its selection accuracy at the variant's speed, and its latency
    timed there, as trained (the untrained figure was its lower bound) → why it stops (None: in budget)."""
    sc, speed, epochs = r.cfg.search, entry["speed"], cfg.epochs
    exits_cfg = ExitsConfig(seed=cfg.seed, threads=cfg.threads)
    target = folder + EXITS_FOLDER
    Stage(f"search.{base_of(variant)}.e{epochs}.exits", target,
          stage_key("search.exits", typed.to_dict(exits_cfg), [key]), schema.COMPLETE_MARKER, local=True).run(
        lambda work: r.fn.exits(folder, out.scored, work, exits_cfg, overwrite=True, progress=False), log)
    entry["folder"] = target
    selection = r.fn.evaluate(target, out.selection, speed=speed, **r.augment.column_kwargs())
    entry["selection_accuracy"][f"{epochs} epochs"] = selection["accuracy"]
    texts = timing_texts(r, out)
    timed = model_latency({variant: target}, texts, rounds=sc.timing_rounds, speeds={variant: speed})["models"]
    why = over_budget({**entry, "latency_1": timed[variant]["latency_1"]}, sc, entry.get("teacher_ms"))
    entry.setdefault("trained", {})[f"{epochs} epochs"] = {"latency_1": timed[variant]["latency_1"],
                                                          "mean_layers": selection.get("mean_layers"),
                                                          "over_budget": why}
    return f"over budget as trained, at speed {speed:g}: {'; '.join(why)}" if why else None


def rank(alive: list[str], record: dict, rung: str, order: list[str]) -> list[str]:
    """`alive`, best first: by selection accuracy at `rung`; at equal accuracy the faster variant (its latency at that
    rung), then the space's order. One row of the selection split is a tenth of a point, so ties are common, and of
    two variants that select alike the user wants the faster one (an int8 export over its float32 candidate)."""
    return sorted(alive, key=lambda n: (-record[n]["selection_accuracy"][rung], latency_at(record[n], rung),
                                        order.index(n)))


def halve(r: Run, out: RunOutputs, configs: dict[str, StudentConfig], alive: list[str], record: dict, log) -> str:
    """Successive halving over `alive` → the chosen candidate; each candidate's accuracies and end in `record`."""
    sc = r.cfg.search
    sizes = rung_sizes(len(alive), sc.rungs, sc.keep)
    upstream = [fs.read_json(fs.join(d, schema.STAGE_FILE))["key"] for d in (out.scored, out.dev_scored)]
    order = list(record)
    for rung, (epochs, size) in enumerate(zip(sc.rungs, sizes)):
        for name in list(alive):
            why = train_rung(r, out, name, configs[base_of(name)], epochs, upstream, record[name], log)
            if why:
                record[name]["stopped"] = f"rung {rung + 1} ({epochs} epochs): {why}"
                alive.remove(name)
        if not alive:
            raise UserError(f"search: every candidate left stopped at rung {rung + 1}: int8 variants whose export "
                            "was refused, or early-exit variants over budget as trained (search.json says why each "
                            "stopped); set search.int8: false or search.exit_speeds: [], or add candidates")
        ranked = rank(alive, record, f"{epochs} epochs", order)
        keep = sizes[rung + 1] if rung + 1 < len(sizes) else 1
        for name in ranked[keep:]:
            record[name]["stopped"] = f"rung {rung + 1} ({epochs} epochs): not among the best {keep} of {size}"
        alive = ranked[:keep]
        log(f"[search] rung {rung + 1}: {size} trained {epochs} epochs; kept {', '.join(alive)}")
    record[alive[0]]["stopped"] = "chosen: the best selection accuracy of the last rung (the faster at a tie)"
    return alive[0]


def run_search(r: Run, out: RunOutputs, space: Space, folder: str, log) -> dict:
    sc, configs = r.cfg.search, space.configs
    if space.dropped:
        log(f"[search] dropped before the first stage, the teacher ({space.teacher}) cannot give them: {space.said()}")
    timed, conditions = timed_untrained(r, out, configs, log, space.dropped)
    timed = {**timed, **{name: {"refused": why} for name, why in space.dropped.items()}}  # recorded as refused
    record = {name: {**entry, "over_budget": None, "stopped": entry["refused"]} if "refused" in entry else
              {**entry, "over_budget": over_budget(entry, sc, entry["teacher_ms"])} for name, entry in timed.items()}
    alive = in_budget(timed, sc)
    for name in record:
        if record[name]["over_budget"]:
            record[name]["stopped"] = "over budget: " + "; ".join(record[name]["over_budget"])
    if not alive:
        busy = f"; timed on a busy machine ({timing.describe(conditions)})" if conditions.get("busy") else ""
        raise UserError(none_in_budget(timed, sc, busy=busy))
    chosen = halve(r, out, configs, alive, record, log)
    source = record[chosen].pop("folder")
    target = fs.join(folder, CHOSEN_DIR)
    ship(chosen, record[chosen], source, target, f"{sc.rungs[-1]} epochs",
         lambda src, dst: r.fn.export(src, dst, format="onnx", overwrite=True))
    doc = {"budget": {k: getattr(sc, k) for k in ("budget_ms", "budget_mb", "budget_speedup")}, "chosen": chosen,
           "from": source, "rungs": list(sc.rungs), "keep": sc.keep, "runtime": sc.runtime, "int8": sc.int8,
           "exit_speeds": list(sc.exit_speeds), "timing_conditions": conditions,
           "candidates": {n: {k: v for k, v in e.items() if k != "folder"} for n, e in record.items()}}
    fs.write_json(fs.join(folder, SEARCH_FILE), doc, indent=2)
    fs.write_json(fs.join(target, schema.SEARCH_CHOICE_FILE), chosen_by(doc), indent=2)
    card.write_card(target)  # the report rewrites it with the test figures
    log(f"[search] chosen: {chosen} ({latency_at(record[chosen], f'{sc.rungs[-1]} epochs'):.3g} ms, selection "
        f"accuracy {record[chosen]['selection_accuracy'][f'{sc.rungs[-1]} epochs']:.4f})")
    return doc


def ship(chosen: str, entry: dict, source: str, target: str, last: str, export=None) -> None:
    """The chosen variant's folder copied to `target`, or, for a candidate timed as its ONNX export (`export`:
    source, target → that export), the export of it: what is shipped is what met the budget. A variant's (int8,
    exits) or an export's metrics are its training's at the variant's selection accuracy (the report reads a
    student's metrics), and an early-exit variant answers at its speed when a call gives none (exits.json)."""
    fs.delete(target)
    exported = export is not None and chosen == base_of(chosen) and entry.get("runtime") == ONNX_RUNTIME
    if exported:
        export(source, target)
    else:
        fs.copy_tree(source, target)
        if chosen == base_of(chosen):
            return
    metrics = fs.read_json(fs.join(source.removesuffix(INT8_FOLDER).removesuffix(EXITS_FOLDER), schema.METRICS_FILE))
    metrics["dev_accuracy"] = entry["selection_accuracy"][last]
    if chosen.endswith(INT8):
        metrics["quantize"] = "int8"
    elif EXITS in chosen:
        metrics["exits"] = {"speed": entry["speed"],
                            **{k: v for k, v in entry["trained"][last].items() if k != "over_budget"}}
        write_speed(schema.model_dir(target), entry["speed"])
    fs.write_json(fs.join(target, schema.METRICS_FILE), metrics, indent=2)


def chosen_by(doc: dict) -> dict:
    """What the chosen student's card says it was chosen against (data/card.py): the budget, the candidates within
    it, the rungs, its selection accuracy and the runner-up of the last rung."""
    last = f"{doc['rungs'][-1]} epochs"
    c = doc["candidates"]
    finalists = rank([n for n in c if (c[n].get("selection_accuracy") or {}).get(last) is not None
                      and not c[n].get("trained", {}).get(last, {}).get("over_budget")], c, last, list(c))
    runner_up = next((n for n in finalists if n != doc["chosen"]), None)
    chosen = c[doc["chosen"]]
    exits = {"timed": f"trained, with early exits at speed {chosen['speed']:g}"} if "trained" in chosen else {}
    return {"budget": doc["budget"], "runtime": ("int8" if doc["chosen"].endswith(INT8) else
                                                 "exits" if exits else doc["runtime"]), **exits,
            "rungs": doc["rungs"], "candidates": len(c),
            "within_budget": sum(e["over_budget"] == [] for e in c.values()),
            "latency_1": latency_at(chosen, last),
            "selection_accuracy": chosen["selection_accuracy"][last],
            "runner_up": runner_up and {"name": runner_up, "accuracy": c[runner_up]["selection_accuracy"][last]}}


def plan_probe(r: Run, out: RunOutputs, space: Space, ready: bool, sample: Sequence[str]) -> Optional[dict]:
    """The candidates timed untrained for the plan (search_timing.probe) and, when none of the variants meets the
    budget, the refusal the plan stops the run with before its first stage (time_budget.plan_time)."""
    got = probe(r, out, space.configs, ready, sample, space.dropped)
    if got is not None and not in_budget(got["variants"], r.cfg.search):
        got["refuse"] = none_in_budget(got["variants"], r.cfg.search,
                                       " (timed untrained" + (f", {got['before']})" if got["before"] else ")"))
    return got


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    sc = r.cfg.search
    if sc is None:
        return []
    if fs.is_remote(r.cfg.run_dir):
        raise ConfigError(f"search: run_dir {r.cfg.run_dir} is a URL; the search saves and times its candidates in "
                          "local folders: give a local run_dir")
    if NAME in r.cfg.students:
        raise ConfigError(f"students.{NAME}: the search's chosen student has that name; rename the student")
    space = searched(r.cfg)
    if not space.configs:
        raise ConfigError(f"search: the teacher ({space.teacher}) can give none of the candidates: {space.said()}: "
                          "give candidates it can make in search.space")
    folder = r.path("search")
    out.students[NAME] = fs.join(folder, CHOSEN_DIR)
    out.search = fs.join(folder, SEARCH_FILE)
    out.model_stages.append("search")
    settings = {"search": {k: v for k, v in typed.to_dict(sc).items() if k not in ("space", "base")},
                "candidates": {name: student_settings(r.rules, cfg) for name, cfg in space.configs.items()}}
    return [StageDef("search", folder, settings, ("score", "dev.score", "teacher"), done_file=SEARCH_FILE,
                     run=lambda work: run_search(r, out, space, work, r.log),
                     probe=lambda ready, sample: plan_probe(r, out, space, ready, sample),
                     estimate=lambda c: search_estimate("search", c.cfg.search, c.transfer, c.rows, c.rates,
                                                        searched(c.cfg)), budgeted=False)]


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


def levers(cfg: RunConfig, stages: Sequence[StageDef], rows: Rows) -> list[Lever]:
    """The epochs of the search's last rung (down to the rung before's), at a student epoch's cost."""
    if cfg.search is None or not any(s.name == "search" for s in stages):
        return []
    rungs = cfg.search.rungs
    return [Lever("search's last rung", rungs[-1], list(range(rungs[-1] - 1, rungs[-2] if len(rungs) > 1 else 0, -1)),
                  lambda c, v: replace(c, search=replace(c.search, rungs=(*rungs[:-1], v or rungs[-1]))),
                  ("search",), EPOCH_LOSS)]


def measures(cfg: RunConfig, will_run: set[str]) -> dict:
    """The step of each candidate the teacher can give (searched), as `search.NAME`, when the search runs."""
    if "search" not in will_run or cfg.search is None:
        return {}
    return {"students": {f"search.{n}": c for n, c in searched(cfg).configs.items()}}


KIND = register(StageKind("search", build, after=("students",), before=("test",), levers=levers,
                          measures=measures))
