"""`transferset migrate RUN_DIR`: a run folder written under earlier key rules (layouts 1 to 5) converted to today's.

Today's key rules are transferset/app/stages/keys.py's; each earlier layout's are in rules.py beside this module.
Migrating computes the folder's rules and today's for the run's config (RUN/config.yaml, the last run's settings,
their earlier names and forms read as today's, unless --config is given): a folder whose record holds its earlier
key (or a layout-1 legacy form of it) is the same work, and its record gets today's key, so the next `transferset
run` reuses it (or resumes it, when it was killed while running: a checkpoint's settings take today's names and
forms too). A folder whose record holds any other key is left as it is: the next run does it again. Nothing else
is changed but RUN/config.yaml, written again under today's names (a run reads the cuts its budget made there). A
stage no earlier run had (compress.ship's exports) has nothing to convert: the next run does it.

Settings added since keep the value of then in the earlier keys (rules.ADDED_SINCE): every earlier teacher ran every
epoch, so its folder is the work of `teacher.patience: null`, and under today's default (1, early stopping) it trains
again, as migrate says. Migrating a folder it converted already judges again, under the config given, what that
conversion left to run and no run has done since, so `teacher.patience=null` given afterwards still keeps it.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
from typing import Any, Optional, Sequence

from students.losses import canonical
from transferset import fs
from transferset.app.run import runner
from transferset.app.stages import keys
from transferset.app.migrate.rules import (OPTIM_ADDED, RULES, V1, grouped_optim, grouped_student, renamed,
                                           student_legacy)
from transferset.app.stages.plan import build_plan
from transferset.app.stages.base import stage_key
from transferset.app.stages.context import StageFunctions
from transferset.app.stages.search import CHOSEN_DIR
from transferset.config import TeacherConfig
from transferset.app.migrate.spellings import RENAMED, TRAINER_OPTIM
from transferset.contract import schema
from transferset.data.splits import SPLIT_STATS_FILE
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError, UserError
from transferset.training.checkpoints import CHECKPOINT_FILE, CHECKPOINT_FINGERPRINT

# --- the conversion ------------------------------------------------------------------------------

def _finished(folder: str, done_file: str, kind: str) -> bool:
    """Finished as layout 1 saw it: the done file, or a trainer's metrics.json in a folder the output protocol
    never wrote (a teacher or student finished before the protocol's records existed)."""
    if fs.exists(fs.join(folder, done_file)):
        return True
    return kind in ("teacher", "student") and fs.exists(fs.join(folder, schema.METRICS_FILE)) \
        and not fs.exists(fs.join(folder, schema.MANIFEST_FILE))


def convert(cfg, files, log, rules: keys.KeyRules = V1, again: bool = False) -> dict[str, list[str]]:
    """Each stage of `cfg`'s run converted where its folder holds the same work → {"reused": [...], "rerun":
    [...], "resumed": [...]} by stage name. Every stage is judged before any record is written, so a conversion
    that stops midway changes nothing; a record converted already (its key today's) counts as converted.
    `rules`: those the folder's keys were made by (RULES; keys: today's, whose records need no conversion).
    `again`: the folder is of today's layout, converted before (migrate): a record holding today's key is left as
    it is (converted then, or written by a run since)."""
    verdicts = judge(cfg, files, rules)
    labels = _split_labels(cfg)
    done: dict[str, list[str]] = {"reused": [], "resumed": [], "rerun": []}
    for stage, verdict, key, record in verdicts:
        if verdict != "rerun" and rules is not keys and not (again and record.get("key") == key):
            _apply(stage, verdict, key, record, labels, rules.FIELD)
        done[verdict].append(stage.name)
        log(f"[{stage.name}] {verdict}")
    return done


def judge(cfg, files, rules: keys.KeyRules = V1) -> list[tuple[Any, str, str, dict]]:
    """Each stage of `cfg`'s run that has a folder, judged by its record (a record holding the key `rules` give it
    is the same work) → (stage, "reused" | "resumed" | "rerun", its key today, its record); nothing is written."""
    fn, field = StageFunctions(), getattr(rules, "FIELD", "key")
    old = build_plan(cfg, files, fn, rules=rules).stages
    new = build_plan(cfg, files, fn).stages
    stored: dict[str, str] = {}
    new_keys: dict[str, str] = {}
    verdicts: list[tuple[Any, str, str, dict]] = []
    for o, n in zip(old, new):
        assert o.name == n.name, (o.name, n.name)  # one plan, two key rules
        if any(u not in stored for u in o.upstream):
            verdicts.append((o, "rerun", "", {}))  # its upstream's inputs are not there yet: nothing to keep
            continue
        try:
            new_keys[n.name] = n.key([new_keys[u] for u in n.upstream])
            stored[o.name] = o.key([stored[u] for u in o.upstream])
        except UserError:  # its key reads files an unfinished upstream stage writes (the transfer set's labels)
            verdicts.append((o, "rerun", "", {}))
            continue
        if o.run is None or not o.folder:
            continue
        record = _record(o.folder)
        verdict = _judge(o, record, _accepted(cfg, o, stored, rules), new_keys[n.name], field)
        if verdict != "rerun":
            stored[o.name] = record.get(field, record["key"])  # the folder's key stood for it downstream
        verdicts.append((o, verdict, new_keys[n.name], record))
    return verdicts


def _record(folder: str) -> dict:
    path = fs.join(folder, schema.STAGE_FILE)
    return fs.read_json(path) if fs.exists(path) else {}


def _accepted(cfg, stage, stored: dict, rules: type) -> set:
    """The earlier keys that name this stage's work: its key, and a layout-1 student's legacy forms."""
    accepted = {stored[stage.name]}
    if stage.kind == "student" and rules is V1:
        s_cfg = cfg.students[stage.name.split(".", 1)[1]]
        settings = stage.settings() if callable(stage.settings) else stage.settings
        accepted |= {stage_key("student", f, [stored[u] for u in stage.upstream])
                     for f in student_legacy(s_cfg, settings)}
    return accepted


def _judge(stage, record: dict, accepted: set, new_key: str, field: str) -> str:
    today = record.get("key") == new_key  # converted already, or written by a run since a conversion (migrate)
    if record.get("key") not in accepted and not today:
        return "rerun"
    if record.get("running"):
        return "resumed"
    return "reused" if _finished(stage.folder, stage.done_file, stage.kind or stage.name) else "rerun"


def _split_labels(cfg) -> Optional[list]:
    """The label set split.json records when the run splits train (plan.Run.split_labels gives it the teacher)."""
    path = fs.join(cfg.run_dir, "data", SPLIT_STATS_FILE)
    return fs.read_json(path).get("label_names") if fs.exists(path) else None


def _apply(stage, verdict: str, new_key: str, record: dict, labels: Optional[list], field: str) -> None:
    """Rewrite a stage's record under its new key (its done file too where layout 1 did without it, a killed
    trainer's checkpoint where it resumes)."""
    kind = stage.kind or stage.name
    if verdict == "resumed" and kind in ("teacher", "student") and not fs.is_remote(stage.folder):
        convert_checkpoint(os.path.join(stage.folder, "checkpoint"), teacher=kind == "teacher", labels=labels)
    if verdict == "reused" and not fs.exists(fs.join(stage.folder, stage.done_file)):
        fs.write_text(fs.join(stage.folder, stage.done_file), "")
    if verdict == "reused" and kind in METRICS_OF:
        convert_metrics(fs.join(stage.folder, *METRICS_OF[kind]))
    fs.write_json(fs.join(stage.folder, schema.STAGE_FILE),
                  {**record, "key": new_key, field: record.get(field, record["key"])})


# A finished stage's student metrics, which the report and the cards read: a student's own, a search's chosen one.
METRICS_OF = {"student": (schema.METRICS_FILE,), "search": (CHOSEN_DIR, schema.METRICS_FILE)}


def convert_metrics(path: str) -> bool:
    """A student's metrics.json in today's form: its `config` under today's names and forms (`today_student`), no
    top-level `schedule` (the phase plan is config.phases); False: no such file."""
    if not fs.exists(path):
        return False
    metrics = fs.read_json(path)
    metrics.pop("schedule", None)
    if isinstance(metrics.get("config"), dict):
        metrics["config"] = today_student(metrics["config"])
    fs.write_json(path, metrics)
    return True


def teacher_fingerprint(old: dict, labels: Optional[Sequence[str]] = None) -> dict:
    """An earlier teacher checkpoint's fingerprint in today's form (teacher.train._checkpoints): its lr and weight
    decay under `optim:` with the gradient clipping every earlier teacher had (1.0); `patience` null where it has
    none (it ran every epoch); a layout-1 one's engine section whole, the flat warm-up and the fields that
    differed from the teacher's default engine put back into one section, and, when the run splits train (`labels`:
    split.json's), the label set the run now gives a teacher that names none (the one the labeled rows gave it
    then, unless a class had no labeled row)."""
    settings = json.loads(old["settings"])
    if "optim" not in settings:  # its optimizer's settings at the top, as they were before the section
        settings = grouped_optim(settings, TRAINER_OPTIM["teacher"])
        settings["optim"] = {**settings.get("optim", {}), "grad_clip": OPTIM_ADDED["teacher"]["grad_clip"]}
    if "patience" not in settings:  # a teacher of before the setting ran every epoch (rules.ADDED_SINCE)
        settings["patience"] = None
    if "warmup" in settings:  # else its engine section is whole already
        engine = {k: v for k, v in typed.to_dict(TeacherConfig().engine).items() if k != "tracker"}
        engine.update(warmup=settings.pop("warmup"), **settings.pop("engine", {}))
        if labels is not None and settings.get("labels") is None:
            settings["labels"] = list(labels)
        settings["engine"] = engine
    return {**old, "settings": json.dumps(settings, sort_keys=True, default=str)}


def recipe_state(saved: dict) -> dict:
    """A checkpoint written before the recipe's state became dataclasses (one flat mapping, one random state) in
    the form the recipe reads (training.recipe.RecipeState, PhaseState)."""
    if "recipe" in saved:
        return saved
    phase = {name: saved.get(name) for name in ("epoch", "batches", "phase_step", "best_state", "start_acc",
                                                "partial")}
    phase.update(index=saved["phase"], best_acc=saved.get("best_acc", -1.0), bad=saved.get("bad", 0))
    recipe = {"history": saved.get("history", []), "phase_log": saved.get("phase_log", []),
              "global_step": saved["global_step"]}
    return {**saved, "phase": phase, "recipe": recipe, "rng": [saved["rng"]]}


def convert_checkpoint(folder: str, teacher: bool, labels: Optional[Sequence[str]] = None) -> bool:
    """A killed training's checkpoint in today's form (its state, and a teacher's fingerprint); False: none there."""
    import torch  # noqa: PLC0415  (only a folder with a checkpoint needs it)

    path = os.path.join(folder, CHECKPOINT_FILE)
    if not os.path.exists(path):
        return False
    saved = recipe_state(torch.load(path, map_location="cpu", weights_only=True))
    if teacher:
        saved["fingerprint"] = teacher_fingerprint(saved["fingerprint"], labels)
    else:  # a student's settings under today's names and forms
        settings = today_student(json.loads(saved["fingerprint"]["settings"]))
        if "losses" in settings:
            settings["losses"] = canonical(settings["losses"])
        saved["fingerprint"] = {**saved["fingerprint"], "settings": json.dumps(settings, sort_keys=True, default=str)}
    torch.save(saved, path + ".partial")
    os.replace(path + ".partial", path)
    with open(os.path.join(folder, CHECKPOINT_FINGERPRINT), "w", encoding="utf-8") as fh:
        json.dump(saved["fingerprint"], fh, sort_keys=True, default=str)
    return True


def today_student(settings: dict) -> dict:
    """A student's settings (a mapping, whole or partial) under today's names (spellings.RENAMED) and in today's
    form (its losses under `losses:`, its optimizer's settings under `optim:`: rules.grouped_student)."""
    return grouped_student(renamed(settings, RENAMED))


def today_names(raw: dict) -> dict:
    """A run config's mapping with each student's settings (a search's candidates too) under today's names and in
    today's form (`today_student`), and the teacher's, prune's and exits' optimizer settings under `optim:`
    (`grouped_optim`): the config of a run folder made before, as RUN/config.yaml holds it."""
    def today(section):
        return today_student(section) if isinstance(section, dict) else section

    for place in TRAINER_OPTIM:
        *outer, name = place.split(".")
        holder = raw.get(outer[0]) if outer else raw
        if isinstance(holder, dict) and isinstance(holder.get(name), dict):
            holder[name] = grouped_optim(holder[name], TRAINER_OPTIM[place])
    if isinstance(raw.get("students"), dict):
        raw["students"] = {name: today(s) for name, s in raw["students"].items()}
    search = raw.get("search")
    if isinstance(search, dict):
        if "base" in search:
            search["base"] = today(search["base"])
        if isinstance(search.get("space"), dict):
            search["space"] = {name: today(s) for name, s in search["space"].items()}
    return raw


def migrate(run_dir: str, config: Optional[str] = None, overrides: Sequence[str] = (), log=print) -> dict:
    """Convert RUN_DIR's records to today's layout (see the module's docstring); returns convert()'s verdicts. Only a
    run folder: a path that is none, a folder with neither a layout record nor a stage record, a layout of a newer
    transferset and a stage folder reached through a symbolic link are refused before anything is written. A folder
    converted already is judged again under the config given (`converted_from`); one of today's layout that no
    conversion made has nothing to convert."""
    _check_folder(run_dir)
    layout = keys.read_layout(run_dir)
    if layout is not None and layout > keys.LAYOUT:
        raise ConfigError(f"{run_dir} records layout {layout}, written by a newer transferset (this one writes layout "
                          f"{keys.LAYOUT}): run it with that transferset; this one converts layouts 1 to 5 only")
    config = config or fs.join(run_dir, runner.CONFIG_FILE)
    nothing = {"reused": [], "resumed": [], "rerun": []}
    if layout == keys.LAYOUT and not fs.exists(config):
        log(f"{run_dir}: already layout {keys.LAYOUT}; nothing to convert")
        return nothing
    if not fs.exists(config):
        raise ConfigError(f"{run_dir}: no {runner.CONFIG_FILE} (not a run folder?); give the run's --config YAML")
    own = config == fs.join(run_dir, runner.CONFIG_FILE)
    raw = today_names(typed.read_yaml(config))
    cfg = runner.load_overridden(copy.deepcopy(raw), [*overrides, f"run_dir={run_dir}"], config)
    files = runner.resolve_data(cfg.data, cfg.test, cfg.dev)
    stages = [s for s in build_plan(cfg, files, StageFunctions()).stages if s.run is not None and s.folder]
    recorded = {s.name for s in stages if fs.exists(fs.join(s.folder, schema.STAGE_FILE))}
    again = layout == keys.LAYOUT
    if again:
        layout = converted_from(stages)
        if layout is None:
            log(f"{run_dir}: already layout {keys.LAYOUT}; nothing to convert")
            return nothing
        log(f"{run_dir}: already layout {keys.LAYOUT}, converted from layout {layout}: what that conversion left to "
            "run again and no run has done since is judged again, under this config")
    if layout is None and not recorded:
        lacking = ", ".join(_inside(run_dir, s.folder) for s in stages[:2])
        raise ConfigError(f"{run_dir} holds no stage record ({lacking}, … one in each of its run's {len(stages)} "
                          f"stage folders) and no layout record ({keys.LAYOUT_FILE}): it is not a run folder, and "
                          "migrate converts run folders only")
    with runner.output_lock(run_dir, command="migrate"):
        runner.check_links(run_dir, stages)  # as `run`: a record written through a link changes another folder
        if layout == keys.DAMAGED:
            layout = detect(cfg, files, len(recorded), fs.join(run_dir, keys.LAYOUT_FILE), log)
        done = convert(cfg, files, log, CANDIDATES[layout], again=again)
        keys.write_layout(run_dir)
        if own:  # the last run's settings under today's names, as a run reads them (a budget's cuts kept: earlier_cut)
            runner.record_config(runner.load_overridden(raw, [f"run_dir={run_dir}"], config))
    patience_note(cfg, files, CANDIDATES[layout], done, run_dir, log)
    first = [name for name in done["rerun"] if name not in recorded]  # a stage of no earlier run: compress.ship
    rerun = [name for name in done["rerun"] if name in recorded]
    log(f"{run_dir}: layout {keys.LAYOUT}; {len(done['reused'])} finished stage(s) kept, {len(done['resumed'])} "
        f"to resume, {len(rerun)} to run again ({', '.join(rerun) or 'none'})"
        + (f", {len(first)} that never ran here to run ({', '.join(first)})" if first else ""))
    return done


def converted_from(stages) -> Optional[int]:
    """The earlier layout a folder of today's layout was converted from: the one whose key a converted record keeps
    (rules.V1.FIELD, …); None: no conversion made it."""
    fields = {CANDIDATES[layout].FIELD: layout for layout in (5, 4, 3, 2, 1)}
    for s in stages:
        record = _record(s.folder)
        for field, layout in fields.items():
            if field in record:
                return layout
    return None


def patience_note(cfg, files, rules: keys.KeyRules, done: dict, run_dir: str, log) -> None:
    """Say it plainly when a teacher of the folder trains again only because the config stops early: every teacher
    before `teacher.patience` ran every epoch, which only `patience: null` keys as (rules.ADDED_SINCE)."""
    teachers = [name for name in done["rerun"] if name == "teacher" or name.startswith("teacher.")]
    if cfg.teacher.patience is None or rules is keys or not teachers:
        return
    every_epoch = dataclasses.replace(cfg, teacher=dataclasses.replace(cfg.teacher, patience=None))
    kept = [s.name for s, verdict, _, _ in judge(every_epoch, files, rules)
            if s.name in teachers and verdict != "rerun"]
    if not kept:
        return
    default = ", today's default" if cfg.teacher.patience == TeacherConfig().patience else ""
    log(f"[{', '.join(kept)}] trained before teacher.patience existed: it ran every epoch, as `teacher.patience: null` "
        f"does, and this config's teacher.patience is {cfg.teacher.patience}{default}, which stops early: it trains "
        f"again, and every stage after it. To keep it: `transferset migrate {run_dir} teacher.patience=null` (it "
        "converts it still, until a run trains it again), and the same setting for `run` (`teacher: {patience: null}` "
        "in the run's config, or the override)")


def _check_folder(run_dir: str) -> None:
    if not fs.exists(run_dir):
        raise ConfigError(f"{run_dir} does not exist: give a run folder")
    if not fs.isdir(run_dir):
        raise ConfigError(f"{run_dir} is a file, not a run folder")


def _inside(run_dir: str, folder: str) -> str:
    """A stage's record as a path inside the run folder."""
    top = run_dir.rstrip("/") + "/"
    return (folder[len(top):] if folder.startswith(top) else folder) + "/" + schema.STAGE_FILE


# The key rules a run folder's records may follow by layout, today's first (it wins a tie, then the later layouts).
CANDIDATES: dict[Any, Any] = {keys.LAYOUT: keys, 5: RULES[5], 4: RULES[4], 3: RULES[3], 2: RULES[2], 1: RULES[None],
                              None: RULES[None]}


def detect(cfg, files, recorded: int, record: str, log) -> int:
    """The layout whose keys most stage records of `cfg`'s run hold, for a folder whose layout `record` is damaged:
    a record holding the key a layout's rules give its stage proves that stage's work, whatever the record says."""
    kept = {layout: sum(verdict != "rerun" for _, verdict, _, _ in judge(cfg, files, CANDIDATES[layout]))
            for layout in (keys.LAYOUT, 5, 4, 3, 2, 1)}
    layout = max(kept, key=kept.__getitem__)
    damaged = f"{record} is damaged (it names no layout)"
    if not kept[layout]:
        log(f"{damaged}; none of its {recorded} stage records holds a key of any layout for this config: the run "
            "does every stage again")
    elif layout == keys.LAYOUT:
        log(f"{damaged}; its stage records hold today's keys ({kept[layout]} of {recorded} stages): its record "
            "rewritten")
    else:
        log(f"{damaged}; its stage records hold layout {layout}'s keys ({kept[layout]} of {recorded} stages): "
            f"converted as layout {layout}")
    return layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by an earlier transferset")
    parser.add_argument("--config", metavar="YAML",
                        help="the run's config (default: RUN_DIR/config.yaml, the settings of its last run)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the run's key=value overrides, as given to run")


def run(args, extra: Sequence[str]) -> int:
    migrate(args.run_dir, args.config, args.overrides)
    return 0
