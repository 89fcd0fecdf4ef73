"""`transferset run --config YAML [key=value ...]`: teacher → augment → score → students → report.

Each stage writes into its own folder of the run directory with a `.stage.json` holding a
content hash of its settings and of everything upstream. A rerun reuses every stage whose
hash is unchanged and complete, so after a crash or a changed student setting only what
changed is redone. Stages run the same code as the subcommands, in this process.

`run_dir` and `data` may be URLs (gs://, any scheme fsspec and Beam know): the bookkeeping goes
through transferset.fs, the pipelines through Beam's FileSystems. Stages whose code writes local
files only (the teacher's fine-tuning, the students) write to a local staging folder that is then
uploaded to the run directory; the score workers fetch the teacher from there (teacher.remote).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from pipelines.runtime import check_beam
from students.data.teacher_files import check_dir_setting, refuse_student_folder
from students.losses import check as check_losses
from transferset import fs
from transferset.app.run import init as starter_init, preflight
from transferset.app.stages import keys
from transferset.app.planning.calibrate import measure_rates
from transferset.app.planning.time_budget import Budget, Measure, changes, plan_time
from transferset.app.stages.plan import RunPlan, build_plan
from transferset.app.report.chosen import CHOSEN_DIR, CHOSEN_FILE, ship
from transferset.app.report import FIGURES_DIR, REPORT, RESULTS, TABLE
from transferset.app.stages.base import Stage, StageDef
from transferset.app.stages.context import DataFiles, StageFunctions, splits_train
from transferset.app.stages.search import candidate_configs
from transferset.augment import check_ops, needs
from transferset.config import LAYER_TEXTS_REST, RunConfig
from transferset.config.precedence import apply_override
from transferset.contract import schema
from transferset.data.card import update_run_cards
from transferset.fs.links import links_on_the_way, links_under, refuse_links
from transferset.fs.lock import output_lock
from transferset.models import loading
from transferset.runtime import deadline, typed
from transferset.runtime.errors import ConfigError, UserError
from transferset.runtime.progress import log_line
from transferset.sources import HF_PREFIX, check_hf_names
from transferset.teacher import ensemble
from transferset.training import check_engine

STAGE_FILE = schema.STAGE_FILE
CONFIG_FILE = "config.yaml"  # RUN/config.yaml: the settings of the last run, as `transferset migrate` reads them
SHARED_SST2 = os.path.join("..", "shared", "data", "sst2")
HF_SST2 = ("hf:glue:sst2:train", "hf:glue:sst2:validation")

EPILOG = """Settings: transferset/config/ (RunConfig and one dataclass per section: teacher, augment, score,
students.NAME, beam); every value is type-checked before any stage runs.

examples:
  transferset run --data reviews.csv --text-column review --label-column sentiment
  transferset run --config configs/demo.yaml
  transferset run --config configs/demo.yaml data=path/to/sst2 students.distilled.epochs=3
  transferset run --config configs/sst2_tang.yaml run_dir=runs/tang_seed1 augment.seed=1"""


# --- configuration ---------------------------------------------------------------

def load_config(path: Optional[str], overrides: Sequence[str] = (), data: Optional[dict] = None,
                as_typed: Optional[Mapping[str, str]] = None) -> RunConfig:
    """The run config of a YAML file plus key=value overrides, type-checked before anything runs.

    `data`: the data flags (`--data` and its columns and files, init.data_kwargs's keys with `data`), over
    the YAML's settings; with no YAML, over the starter settings `transferset init` writes (init.starter).
    `as_typed`: each override a flag made (`search.budget_ms=1.0`) → the flag as the user typed it
    (`--budget-ms 1.0`), which a bad value is blamed on."""
    if path:
        raw = typed.read_yaml(path)
        if data:
            raw = starter_init.merge(raw, starter_init.data_settings(**data))
    elif data and data.get("data"):
        raw = starter_init.starter(**data)
    else:
        raise ConfigError("give --config YAML, or --data PATH to run on the packaged defaults")
    return load_overridden(raw, overrides, where=path or "--data", as_typed=as_typed)


def load_overridden(raw: dict, overrides: Sequence[str], where: str,
                    as_typed: Optional[Mapping[str, str]] = None) -> RunConfig:
    """A raw run config with key=value overrides set into it, type-checked (load_raw); `as_typed`: load_config's."""
    for item in overrides:
        apply_override(raw, item)
    # a bad value an override set is blamed on the override as typed, or on the flag that made it, not on the YAML
    return load_raw(raw, where=where,
                    given={item.split("=", 1)[0]: (as_typed or {}).get(item, item) for item in overrides})


def load_raw(raw: dict, where: str, given: Optional[dict[str, str]] = None) -> RunConfig:
    """A raw run config (a YAML's mapping) type-checked, its models and URLs normalised. `given`: the settings
    key=value overrides set (key → the override as typed)."""
    cfg = typed.load(RunConfig, raw, where=where, given=given)
    check_ops(cfg.augment, where=f"{where}: augment")
    check_beam(cfg.beam, where=f"{where}: beam")  # a runner Beam cannot create fails here, not after the teacher
    for name, s in cfg.students.items():  # a misspelt loss fails here, not after the teacher and the scoring
        try:
            check_losses(s.losses, where=f"{where}: students.{name}.losses")
        except UserError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.search is not None:  # a candidate's bad setting fails here too, as a student's does
        candidate_configs(cfg.search)
    if cfg.data and not (cfg.data.startswith("hf:") or cfg.dev or cfg.validation is not None) \
            and not fs.isdir(cfg.data):
        raise ConfigError(f"{where}: data={cfg.data} is one file: give dev: FILE (the selection split), or "
                          "validation: {rows: N} to carve the selection split from it")
    # file:// URLs become local paths here, once; an unknown scheme is a usage error naming the setting.
    # Model settings too (a hub name passes as it is): a bad one stops the run before its first stage.
    students = {name: replace(s, **{k: fs.normalize(getattr(s, k), f"students.{name}.{k}")
                                    for k in ("teacher", "tokenizer") if getattr(s, k)})
                for name, s in cfg.students.items()}
    return replace(cfg, run_dir=fs.normalize(cfg.run_dir, "run_dir"),
                   teacher=replace(cfg.teacher, model=fs.normalize(cfg.teacher.model, "teacher.model")),
                   augment=replace(cfg.augment, mlm_model=fs.normalize(cfg.augment.mlm_model, "augment.mlm_model")),
                   students=students,
                   **{k: fs.normalize(getattr(cfg, k), k) for k in ("data", "dev", "test", "teacher_path")
                      if getattr(cfg, k) and not getattr(cfg, k).startswith("hf:")},
                   **({"teacher_paths": tuple(fs.normalize(p, "teacher_paths") for p in cfg.teacher_paths)}
                      if cfg.teacher_paths else {}))


def check_paths(cfg: RunConfig, files: DataFiles) -> None:
    """Every local directory a setting names exists and holds a model the stage will accept: checked before
    the first stage, so a typo costs no teacher training or scoring (ConfigError: exit 2, nothing written).
    `files`: the run's data files (resolve_data)."""
    members = len(cfg.teacher_paths or cfg.teacher_seeds or [None])
    ensemble.parse_combine(cfg.score.combine, members, "teacher_seeds / teacher_paths")  # before any stage
    # hf: data (a hub dataset offline: one line, not a minute of retries after the first stage)
    if cfg.test and not cfg.test.startswith(HF_PREFIX) and not fs.exists(cfg.test):
        raise ConfigError(f"test={cfg.test}: no such file")
    check_hf_names([("data" if cfg.data else "data (not set: GLUE SST-2 from the Hub)", files.train),
                    ("test", cfg.test)])
    if cfg.teacher_path or cfg.teacher_paths:
        for path in cfg.teacher_paths or [cfg.teacher_path]:
            if not fs.isdir(path):
                key = "teacher_paths" if cfg.teacher_paths else "teacher_path"
                raise ConfigError(f"{key}={path}: no such directory")
        models = []
    else:
        models = [("teacher.model", cfg.teacher.model, cfg.teacher.allow_pickle, cfg.teacher.trust_remote_code)]
    if cfg.augment.makes_variants and needs(cfg.augment, "candidates"):
        models.append(("augment.mlm_model", cfg.augment.mlm_model, cfg.augment.allow_pickle,
                       cfg.augment.trust_remote_code))
    for key, value, allow_pickle, trust in models:
        if fs.is_remote(value):
            continue
        try:
            loading.check_model(value, what=key, allow_pickle=allow_pickle, trust_remote_code=trust)  # a hub name too
        except loading.TeacherLoadError as exc:
            raise ConfigError(str(exc)) from None
    for name, s in cfg.students.items():
        if isinstance(s.model.get("pretrained"), str):
            loading.check_hub_model(s.model["pretrained"], what=f"students.{name}.model.pretrained")
        for key in ("teacher", "tokenizer"):
            value = getattr(s, key)
            check_dir_setting(value, f"students.{name}.{key}")
            refuse_student_folder(value, key, f"students.{name}.{key}")
        if s.layer_texts == LAYER_TEXTS_REST and not splits_train(cfg):
            raise ConfigError(f"students.{name}.layer_texts={LAYER_TEXTS_REST}: the rest of the train file is "
                              "what the labeled and unlabeled pools leave, and this run splits nothing (all of "
                              "train is labeled): set labeled_limit and unlabeled_rows, or give a set's path")
        if s.layer_texts not in (None, LAYER_TEXTS_REST) and not fs.is_remote(s.layer_texts) \
                and not fs.isdir(s.layer_texts):
            raise ConfigError(f"students.{name}.layer_texts={s.layer_texts}: no such directory (a transfer set "
                              f"made by `transferset augment`, or {LAYER_TEXTS_REST}: the train file's rows "
                              "the run leaves out)")


def resolve_data(data: Optional[str], test: Optional[str] = None, dev: Optional[str] = None) -> DataFiles:
    """The run's files: `data` (a train file, an hf: dataset, or a folder or URL holding train.tsv and dev.tsv) if
    given, else ../shared/data/sst2 when present, else the hub's GLUE SST-2; the dev file is `dev`, else the
    folder's dev.tsv or the dataset's validation split (a train file has none); the test file is `test`, else
    the folder's test.tsv when it exists."""
    if data:
        if data.startswith("hf:"):
            return DataFiles(f"{data}:train", dev or f"{data}:validation", test)
        if not fs.isdir(data):
            if not fs.exists(data):
                raise ConfigError(f"data={data}: no such file or folder (a train file, or a folder with train.tsv "
                                  "and dev.tsv)")
            return DataFiles(data, dev, test)
        train, folder_dev = fs.join(data, "train.tsv"), fs.join(data, "dev.tsv")
        for p in (train, *(() if dev else (folder_dev,))):
            if not fs.exists(p):
                raise ConfigError(f"data={data}: {p} not found (expected a folder with train.tsv and dev.tsv)")
        folder_test = fs.join(data, "test.tsv")
        return DataFiles(train, dev or folder_dev, test or (folder_test if fs.exists(folder_test) else None))
    if os.path.exists(os.path.join(SHARED_SST2, "train.tsv")):
        return DataFiles(os.path.join(SHARED_SST2, "train.tsv"), dev or os.path.join(SHARED_SST2, "dev.tsv"), test)
    return DataFiles(HF_SST2[0], dev or HF_SST2[1], test)


def run_stages(stages: Sequence[StageDef], log, refit: Optional[Refit] = None) -> dict[str, str]:
    """Run the declared stages in order, each reused when current; returns every stage's key by name. `refit` (a
    budgeted run's Refit): each stage runs within its share of the minutes left, and after each that ran, the stages
    still to run are re-fitted to the minutes then left."""
    keys: dict[str, str] = {}
    while (s := next((s for s in stages if s.name not in keys), None)) is not None:
        missing = [u for u in s.upstream if u not in keys]
        if missing:
            raise ValueError(f"stage {s.name}: upstream {missing} not declared before it")
        keys[s.name] = s.key([keys[u] for u in s.upstream])
        if s.run is None:
            if s.folder:
                log(f"[{s.name}] reusing {s.folder}")
            continue
        share = refit.share(set(keys) - {s.name}, s.name) if refit is not None and s.budgeted else None
        with deadline.within(share):
            ran = Stage(s.name, s.folder, keys[s.name], s.done_file, s.local, s.resumable, s.resume).run(s.run, log)
        if ran and refit is not None and any(t.name not in keys for t in stages):
            stages = refit.after(set(keys))
    return keys


class Refit:
    """A budgeted run's plan as it goes: the stages still to run re-fitted to the minutes left after each stage that
    ran (time_budget.Budget.refit), the plan built again and the config recorded when that changes a setting."""

    def __init__(self, cfg: RunConfig, plan: RunPlan, budget: Budget, replan: Callable[[RunConfig], RunPlan], log):
        self.cfg, self.plan, self.budget, self.replan, self.log = cfg, plan, budget, replan, log

    def share(self, done: set[str], name: str) -> float:
        return self.budget.share(self.cfg, done, name)

    def after(self, done: set[str]) -> Sequence[StageDef]:
        cut, _ = self.budget.refit(self.cfg, done)
        changed = changes(self.cfg, cut)
        if changed:
            self.log(f"re-fitted to the {self.budget.left() / 60:.1f} minutes left: {'; '.join(changed)}")
            self.cfg, self.plan = cut, self.replan(cut)
            record_config(self.cfg)
        return self.plan.stages


def run_pipeline(cfg: RunConfig, log=lambda m: print(m, file=sys.stderr, flush=True),
                 functions: StageFunctions = StageFunctions(), measure: Optional[Measure] = None,
                 plan_only: bool = False) -> Optional[dict]:
    """Every stage of the run, each reused when current; returns the report's table and paths (`plan_only`: None
    after the plan is printed, before anything is written).

    `measure` (calibrate.measure_rates, as `run` passes): the plan, each stage's rows and minutes, is printed
    before the first stage and cut to fit `budget_minutes` (estimate.py); None: no plan unless budget_minutes
    asks for one (then measured by calibrate.measure_rates).

    Selection and report never share a split: early stopping and the teacher's best epoch use the
    selection split (the carved validation rows with `validation`, else dev); the test split (the
    `test` file or the data folder's test.tsv; with `validation`, dev) is scored by every model at the
    end and by nothing else. Both are kept out of the transfer set by the leak guard.
    """
    files = resolve_data(cfg.data, cfg.test, cfg.dev)
    check_paths(cfg, files)
    check_engines(cfg)
    preflight.check_run(cfg, files)  # the data's labels and columns, a given teacher's files
    with output_lock(cfg.run_dir, command="run"):  # one run at a time owns run_dir
        plan = plan_stages(cfg, files, functions, log)
        check_links(cfg.run_dir, plan.stages)
        check_layout(cfg.run_dir, plan.stages, cfg.teacher.patience)
        budget = None

        def replan(c: RunConfig) -> RunPlan:
            return plan_stages(c, files, functions, log)

        if measure is not None or cfg.budget_minutes is not None:  # a cut changes keys, never folders
            cfg, budget = plan_time(cfg, files, replan, plan.outputs.data, measure or measure_rates, log,
                                    earlier=recorded_config(cfg.run_dir))
            plan = plan_stages(cfg, files, functions, log)  # afresh: the estimate read what its settings cache
        if plan_only:
            return None
        fs.makedirs(cfg.run_dir)
        keys.write_layout(cfg.run_dir)
        record_config(cfg)
        log(f"data: train {files.train}; selection split {plan.selection}; test split {plan.test or NO_TEST}")
        refit = None if budget is None else Refit(cfg, plan, budget, replan, log)
        run_stages(plan.stages, log, refit)
        if refit is not None:
            cfg, plan = refit.cfg, refit.plan
        result = functions.report(plan.outputs, cfg, log=log)
        results_file = fs.join(cfg.run_dir, RESULTS)
        if fs.exists(results_file):  # every model's card gets the report's figures (test split, latency)
            update_run_cards(run_cards(plan.outputs), results_file)
        if result and result.get("chosen") is not None:
            ship(result["chosen"], cfg.run_dir)  # RUN/chosen: the one model to ship, its card as updated
        return result


def record_config(cfg: RunConfig) -> None:
    """RUN/config.yaml: the settings the run runs, its budget's cuts made (a rerun keeps them: earlier_cut)."""
    fs.write_text(fs.join(cfg.run_dir, CONFIG_FILE), yaml.safe_dump(typed.to_dict(cfg), sort_keys=False))


def recorded_config(run_dir: str) -> Optional[RunConfig]:
    """The config the last run in `run_dir` recorded (RUN/config.yaml), None when there is none it can read."""
    path = fs.join(run_dir, CONFIG_FILE)
    if not fs.exists(path):
        return None
    try:
        return load_raw(yaml.safe_load(fs.read_text(path)), where=path)
    except (ConfigError, UserError, ValueError, yaml.YAMLError):
        return None


def check_layout(run_dir: str, stages: Sequence[StageDef], teacher_patience: Optional[int] = None) -> None:
    """A run folder whose records follow other key rules than these (keys.LAYOUT) is refused before anything runs:
    its finished stages would look unfinished and run again. `transferset migrate` converts it (its teacher only
    under `teacher_patience` None: `_every_epoch`)."""
    layout = keys.read_layout(run_dir)
    if layout == keys.LAYOUT:
        return
    if layout is None:
        if not any(s.folder and fs.exists(fs.join(s.folder, STAGE_FILE)) for s in stages):
            return  # a new run folder
        what = "was written by an earlier transferset (its stage records follow other key rules)"
    elif layout == keys.DAMAGED:
        raise ConfigError(f"run_dir {run_dir} has a damaged layout record ({keys.LAYOUT_FILE}: it names no layout): "
                          f"`transferset migrate {run_dir}` tells from its stage records which key rules they follow "
                          "and converts them so its finished stages are reused (or give another run_dir)")
    elif layout > keys.LAYOUT:
        raise ConfigError(f"run_dir {run_dir} records layout {layout}, written by a newer transferset (this one "
                          f"writes layout {keys.LAYOUT}): run it with that transferset, or give another run_dir")
    else:
        what = f"records layout {layout}, this transferset writes layout {keys.LAYOUT}"
    raise ConfigError(f"run_dir {run_dir} {what}: `transferset migrate {run_dir}` converts its records so its "
                      f"finished stages are reused (or give another run_dir){_every_epoch(stages, teacher_patience)}")


def _every_epoch(stages: Sequence[StageDef], patience: Optional[int]) -> str:
    """What a folder of an earlier layout holding a trained teacher's record is told when the run stops early: that
    teacher ran every epoch (teacher.patience came after it), the work of `patience: null` only."""
    trained = [s for s in stages if (s.kind or s.name) == "teacher" and s.run is not None and s.folder
               and fs.exists(fs.join(s.folder, STAGE_FILE))]
    if patience is None or not trained:
        return ""
    return (f"; its teacher ran every epoch (teacher.patience came after it), and this config's teacher.patience is "
            f"{patience}, which stops early: the teacher trains again unless both commands get teacher.patience=null")


def check_links(run_dir: str, stages: Sequence[StageDef]) -> None:
    """Refuse a symbolic link on the way to, or inside, any folder or file the run writes in `run_dir`
    (transferset.fs.links): a stage would clear and write the folder it points to. Before anything is written."""
    links = [link for name in (CONFIG_FILE, keys.LAYOUT_FILE, REPORT, RESULTS, TABLE, FIGURES_DIR, CHOSEN_DIR,
                               CHOSEN_FILE)
             for link in links_on_the_way(run_dir, fs.join(run_dir, name))]
    for s in stages:
        if s.run is not None and s.folder:
            rel = os.path.relpath(s.folder, run_dir) if not fs.is_remote(s.folder) else s.folder
            links += links_on_the_way(run_dir, s.folder) + [f"{rel}/{link}" for link in links_under(s.folder)]
    refuse_links(run_dir, links, "run_dir")


def plan_stages(cfg: RunConfig, files: DataFiles, fn: StageFunctions = StageFunctions(), log=None) -> RunPlan:
    """The run's stages as data: folders, settings, upstream stages and what each one calls (one module per stage
    kind under transferset/app/stages/)."""
    return build_plan(cfg, files, fn, log=log or log_line)


def run_cards(out: Any) -> dict[str, Any]:
    """The folders whose model cards get the report's figures, by their results row: the teacher (not an
    ensemble's), each student (by its name) and each compressed model with no exits (a model with exits is one
    folder timed at several speeds: its own card)."""
    return {"teacher": None if out.ensemble else out.teacher, "students": out.students,
            "compressed": {name: c.path for name, c in out.compressed.items() if c.speed is None}}


def check_engines(cfg: RunConfig) -> None:
    """Every trainer's engine section that this machine or launch cannot honour is refused before any stage runs."""
    sections = {"teacher.engine": cfg.teacher.engine,
                **{f"students.{name}.engine": s.engine for name, s in cfg.students.items()},
                **({"compress.exits.engine": cfg.compress.exits.engine} if cfg.compress.exits else {}),
                **({"compress.prune.engine": cfg.compress.prune.engine} if cfg.compress.prune else {})}
    for where, engine in sections.items():
        check_engine(engine, where)


NO_TEST = "none: add test.tsv to the data folder, `test: FILE`, or `validation:` to report on a split no choice has seen"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="YAML",
                        help="run configuration (see configs/, or write one with `transferset init`); without it, "
                             "--data runs on the packaged defaults")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="override settings, e.g. data=PATH teacher.epochs=1 students.distilled.epochs=3")
    starter_init.add_data_arguments(parser, required=False)
    parser.add_argument("--budget-minutes", type=float, metavar="M",
                        help="minutes the run may take on this machine: the transfer set and the epochs are cut to "
                             "fit (budget_minutes)")
    parser.add_argument("--plan", action="store_true",
                        help="print the plan (each stage's rows and estimated minutes on this machine, cut to fit "
                             "--budget-minutes) and stop before the first stage, writing nothing")
    budget = parser.add_argument_group("search: the most accurate student under a budget (the `search:` section)")
    for flag, unit in BUDGET_FLAGS.items():
        budget.add_argument(f"--{flag}", type=float, metavar=unit.split(":")[0], help=unit.split(": ", 1)[1])


# run's budget flags, each the search: section's setting of its name (budget_ms, ...): "METAVAR: help"
BUDGET_FLAGS = {
    "budget-ms": "MS: CPU ms per example at batch 1 on one thread, tokenization included (the report's timing)",
    "budget-mb": "MB: the saved model's size on disk",
    "budget-speedup": "X: at least X times the teacher's speed at batch 1",
}


def budget_overrides(args) -> dict[str, str]:
    """The budget flags given, as key=value overrides (the search: section's, budget_minutes) → each flag as typed
    (a flag wins over the file and over key=value)."""
    settings = {**{flag: f"search.{flag.replace('-', '_')}" for flag in BUDGET_FLAGS},
                "budget-minutes": "budget_minutes"}
    return {f"{key}={value}": f"--{flag} {value}" for flag, key in settings.items()
            if (value := getattr(args, flag.replace("-", "_"), None)) is not None}


def run(args, extra: Sequence[str]) -> int:
    data = {"data": args.data, **starter_init.data_kwargs(args)} if args.data else None
    if not args.data and any(starter_init.data_kwargs(args).values()):
        raise ConfigError("--text-column, --label-column, --dev and --test describe --data: give --data too")
    budgets = budget_overrides(args)
    cfg = load_config(args.config, [*args.overrides, *budgets], data, as_typed=budgets)
    starter_init.check_data(cfg)  # a missing column stops the run here, naming the columns the file has
    results = run_pipeline(cfg, measure=measure_rates, plan_only=getattr(args, "plan", False))
    if results is None:
        return 0
    print(results["table"])
    print(f"\nreport: {results['report']}")
    return 0
