"""`transferset migrate RUN_DIR`: a run folder written under earlier key rules (layouts 1 and 2) converted to today's.

Layout 1 keyed a stage by its settings that differ from their defaults, plus the FROZEN ones each key held
when those rules were written, with legacy forms for settings added later and the engine section in the flat
form of before it existed. Layout 2 held every setting at its value, as today's keys do (transferset/app/keys.py,
layout 3), under the names of then: a student's phase plan was `schedule`, now `phases` (precedence.RENAMED).
Migrating computes the folder's rules and today's for the run's config (RUN/config.yaml, the last run's settings,
its earlier names read as today's, unless --config is given): a folder whose record holds its earlier key (or a
layout-1 legacy form of it) is the same work, and its record gets today's key, so the next `transferset run`
reuses it (or resumes it, when it was killed while running: a checkpoint's settings take today's names too). A
folder whose record holds any other key is left as it is: the next run does it again. Nothing else is changed.
These earlier rules are kept here only, for this conversion.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from typing import Any, Optional, Sequence

from transferset import augment as augment_ops
from transferset import fs
from transferset.app import keys, runner
from transferset.app.plan import build_plan
from transferset.app.stages import stage_key
from transferset.app.stages.context import StageFunctions
from transferset.config import TeacherConfig
from transferset.config.precedence import RENAMED
from transferset.contract import schema
from transferset.data.splits import SPLIT_STATS_FILE
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError, UserError
from transferset.training.checkpoints import CHECKPOINT_FILE, CHECKPOINT_FINGERPRINT

# --- the layout-1 rules --------------------------------------------------------------------------

# The settings each section's layout-1 key held whatever their value; any other only when not at its default.
FROZEN: dict[str, tuple[str, ...]] = {
    "teacher": ("model", "epochs", "lr", "batch_size", "max_length", "warmup", "weight_decay", "max_steps",
                "seed", "eval_batch_size", "limit", "text_column", "text_b_column", "label_column", "labels",
                "allow_pickle", "trust_remote_code", "progress", "resume"),
    "augment": ("text_column", "label_column", "text_b_column", "labels", "max_chars", "limit", "recipe", "ops",
                "n_iter", "unlabeled_n_iter", "seed", "p_mask", "mask_token", "p_mlm", "mlm_model", "mlm_top_k",
                "mlm_max_length", "p_ng", "max_n", "p_pos", "spacy_model"),
    "score": ("hidden", "layers", "batch_size", "min_batch_size", "max_length", "forward", "forward_rows",
              "forward_tokens", "shard_rows", "shard_seconds", "allow_incomplete", "large_model", "torch_threads",
              "allow_pickle", "trust_remote_code"),
    "student": ("student", "schedule", "epochs", "lr", "batch_size", "patience", "seed", "weight_decay", "grad_clip",
                "max_length", "shuffle_rows", "threads", "dev_text_b_column", "allow_incomplete", "ce", "mse", "kd",
                "repr", "pkd", "emb_mse", "hidden_mse", "att_mse", "att_kl", "value_kl", "cos", "layer_map",
                "temperature", "tokens", "min_count", "max_vocab", "trim_vocab", "embed_init", "freeze_embeddings",
                "teacher", "tokenizer", "preset", "model", "latency_examples", "agreement_rows", "device", "bf16",
                "report_to", "resume", "checkpoint_steps"),
    "exits": ("targets", "pool", "width", "epochs", "lr", "batch_size", "seed", "max_rows", "max_length", "threads"),
    "prune": ("heads", "importance_loss", "normalize", "epochs", "max_steps", "loss", "temperature", "lr",
              "batch_size", "weight_decay", "grad_clip", "seed", "shuffle_rows", "max_length", "threads", "device"),
    "lowres": ("per_class", "seed"),
    "validation": ("rows", "seed"),
}

# Settings in no key at any value: they change how a stage runs, never what it writes. The augment
# ops' own (AugmentConfig.EXECUTION: batch sizes, threads, trust flags) are declared by each op.
EXECUTION: dict[str, tuple[str, ...]] = {
    # how often the fine-tuning writes a checkpoint changes no weight (added after run directories existed)
    "teacher": ("checkpoint_steps",),
}


def flat_form(values: dict, default: dict, legacy: Sequence[str] = (), ignore: Sequence[str] = ()) -> dict:
    """An engine section (`values`, a dict) in the form layout-1 records held it (stage keys, a teacher checkpoint's
    fingerprint): the `legacy` settings (device, bf16, report_to, warmup) under their names of before the section,
    at any value, and any other field, but `ignore`, only when it differs from the trainer's default engine
    `default` (then under `engine`)."""
    old = {"device": ("device", values["device"]), "bf16": ("precision", values["precision"] == "bf16"),
           "report_to": ("tracker", values["tracker"]), "warmup": ("warmup", values["warmup"])}
    # fp16 is not told by the old bf16 flag: it goes under engine
    covered = {old[name][0] for name in legacy} - ({"precision"} if values["precision"] == "fp16" else set())
    changed = {k: v for k, v in values.items() if k not in covered and k not in ignore and v != default[k]}
    return {**{name: old[name][1] for name in legacy}, **({"engine": changed} if changed else {})}


@functools.cache
def _defaults(cls: type) -> dict[str, Any]:
    return typed.to_dict(cls())


def section(kind: str, cfg: Any) -> dict[str, Any]:
    """A section's settings as its key holds them: FROZEN ones always, any other only when it differs from its
    default, EXECUTION ones (and the config's own EXECUTION tuple) never; a trainer's engine section as
    `engine` says."""
    values, defaults = typed.to_dict(cfg), _defaults(type(cfg))
    if kind == "student":
        values, defaults = earlier_names(values), earlier_names(defaults)
    engine_values = values.pop("engine", None)
    never = set(EXECUTION.get(kind, ())) | set(getattr(cfg, "EXECUTION", ()))
    frozen = FROZEN[kind]
    settings = {k: v for k, v in values.items() if k not in never and (k in frozen or v != defaults.get(k))}
    if engine_values is not None:
        settings.update(engine(kind, engine_values, defaults["engine"]))
    return settings


# A trainer's settings that became fields of its engine section (config.EngineConfig): keys made before the
# section hold them under their old names, at any value (they are FROZEN).
ENGINE_LEGACY: dict[str, tuple[str, ...]] = {"teacher": ("warmup",), "student": ("device", "bf16", "report_to"),
                                             "prune": ("device",), "exits": ()}


# The engine a trainer's keys compare with, where it is not the trainer's default engine today: a BiLSTM's
# default became a linear warm-up and decay (students/families/bilstm.py, BILSTM_ENGINE) after every student had
# trained at a constant rate. Student keys compare with that constant rate, so a BiLSTM at the new default gets
# a new key and retrains, and one set to `engine: {schedule: constant, warmup: 0}` keeps its key and its folder
# (as a transformer student at its default, the constant rate, does).
ENGINE_KEY_DEFAULT: dict[str, dict[str, Any]] = {"student": {"schedule": "constant", "warmup": 0.0}}


def engine(kind: str, values: dict, default: dict) -> dict:
    """A trainer's engine section as its key holds it (config.engine.flat_form): the settings of ENGINE_LEGACY
    under their old names, any other engine field only when it differs from the trainer's default engine
    (over which ENGINE_KEY_DEFAULT says what the keys compare with)."""
    return flat_form(values, {**default, **ENGINE_KEY_DEFAULT.get(kind, {})}, ENGINE_LEGACY[kind])


# --- the compatibility rules, one per function --------------------------------------------------

def teacher(tc: Any) -> dict:
    """A trained teacher's key settings (checkpoint_steps: EXECUTION)."""
    return section("teacher", tc)


def augment(a: Any, exclude: Sequence[str]) -> dict:
    """An augment stage's key: the settings rows depend on, and the content (fingerprints) of the files it
    excludes. The settings of an op the run does not use are in no key (but FROZEN ones: the four ops of
    layout 1 were in every key), so installing an op changes no key; words_per_variant came after run
    directories existed: out while unset (a non-FROZEN setting)."""
    used = {f.name for name in a.ops for f in dataclasses.fields(augment_ops.get(name).settings)}
    unused = {f.name for cls in augment_ops.settings_classes() for f in dataclasses.fields(cls)} - used
    settings = {k: v for k, v in section("augment", a).items() if k not in unused or k in FROZEN["augment"]}
    return {"settings": settings, "exclude": list(exclude)}


def score(sc: Any, members: int) -> dict:
    """A score stage's key: `combine` only with a teacher ensemble (always then, at any value), so a one-teacher
    run keeps the key it had before ensembles existed."""
    settings = section("score", sc)
    if members > 1:
        settings["combine"] = sc.combine
    else:  # one teacher's logits whatever the rule
        settings.pop("combine", None)
    return settings


# Student settings added after run directories existed, in the order they were added: they were in keys as
# None for a while, so a folder holding one of those earlier forms is the same training (student_legacy).
STUDENT_ONCE_AS_NONE = ("layer_epochs", "layer_texts")


def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
    """A student's key settings; `layer_texts_set`: the fingerprint of the layer_texts set it reads (a set the
    run does not make), so a set written again at the same path retrains it. `losses` holds its non-zero
    weights only: a loss at weight 0 trains nothing."""
    settings = section("student", s_cfg)
    if "losses" in settings:
        settings["losses"] = {k: v for k, v in settings["losses"].items() if _weight(v)}
        if not settings["losses"]:
            del settings["losses"]
    if layer_texts_set is not None:
        settings["layer_texts_set"] = layer_texts_set
    return settings


def _weight(value: Any) -> float:
    # students.NAME.losses: {name: weight} or {name: {weight: W, ...its settings}}
    return value.get("weight", 0.0) if isinstance(value, dict) else value


def student_legacy(s_cfg: Any, settings: dict) -> list[dict]:
    """The earlier forms of a student's key `settings` that name the same training: the STUDENT_ONCE_AS_NONE
    settings added up to each point in the key as None, while each of them is unset."""
    forms = []
    for n, name in enumerate(STUDENT_ONCE_AS_NONE, 1):
        if getattr(s_cfg, name) is not None:
            break
        forms.append({**settings, **dict.fromkeys(STUDENT_ONCE_AS_NONE[:n])})
    return forms


def validation(v: Any) -> Optional[dict]:
    """The carve's settings in the data stage's key. `by` is in it unless it is `row`: the carve made before `by`
    existed keeps the key it had then."""
    if v is None:
        return None
    settings = section("validation", v)
    if v.by == "row":
        settings.pop("by", None)
    else:
        settings["by"] = v.by
    return settings


def data(cfg: Any, train: str) -> dict:
    """The data stage's key: the train file's fingerprint and how the run splits it."""
    return {"train": train, "labeled_limit": cfg.labeled_limit, "unlabeled_rows": cfg.unlabeled_rows,
            "lowres": section("lowres", cfg.lowres) if cfg.lowres else None,
            "validation": validation(cfg.validation), "unlabeled_limit": cfg.unlabeled_limit}


def compressed(kind: str, cfg: Any) -> dict:
    return section(kind, cfg)


class V1:
    """The layout-1 key rules, with the names build_plan calls (`rules`)."""

    data, teacher, augment, score, student = staticmethod(data), staticmethod(teacher), staticmethod(augment), \
        staticmethod(score), staticmethod(student)
    compressed = staticmethod(compressed)
    FIELD = "layout1_key"  # where a converted record keeps the key it had


# --- the layout-2 rules: today's, with the settings RENAMED since under their earlier names ---------

def renamed(settings: dict, names: dict[str, str]) -> dict:
    """`settings` with each key `names` maps renamed (a key whose new name is there already stays as it is)."""
    return {names[k] if k in names and names[k] not in settings else k: v for k, v in settings.items()}


def earlier_names(settings: dict) -> dict:
    """A student's settings under the names layouts 1 and 2 knew (precedence.RENAMED, backwards)."""
    return renamed(settings, {new: old for old, new in RENAMED.items()})


class V2:
    """The layout-2 key rules, with the names build_plan calls (`rules`)."""

    data, teacher, augment, score = staticmethod(keys.data), staticmethod(keys.teacher), \
        staticmethod(keys.augment), staticmethod(keys.score)
    compressed = staticmethod(keys.compressed)
    FIELD = "layout2_key"

    @staticmethod
    def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
        return earlier_names(keys.student(s_cfg, layer_texts_set))


RULES = {None: V1, 2: V2}  # a run folder's layout (None: no record, layout 1) → the rules its keys were made by


# --- the conversion ------------------------------------------------------------------------------

def _finished(folder: str, done_file: str, kind: str) -> bool:
    """Finished as layout 1 saw it: the done file, or a trainer's metrics.json in a folder the output protocol
    never wrote (a teacher or student finished before the protocol's records existed)."""
    if fs.exists(fs.join(folder, done_file)):
        return True
    return kind in ("teacher", "student") and fs.exists(fs.join(folder, schema.METRICS_FILE)) \
        and not fs.exists(fs.join(folder, schema.MANIFEST_FILE))


def convert(cfg, files, log, rules: type = V1) -> dict[str, list[str]]:
    """Each stage of `cfg`'s run converted where its folder holds the same work → {"reused": [...], "rerun":
    [...], "resumed": [...]} by stage name. Every stage is judged before any record is written, so a conversion
    that stops midway changes nothing; a record converted already (its key today's) counts as converted.
    `rules`: those the folder's keys were made by (RULES)."""
    fn, field = StageFunctions(), rules.FIELD
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
    labels = _split_labels(cfg)
    done: dict[str, list[str]] = {"reused": [], "resumed": [], "rerun": []}
    for stage, verdict, key, record in verdicts:
        if verdict != "rerun":
            _apply(stage, verdict, key, record, labels, field)
        done[verdict].append(stage.name)
        log(f"[{stage.name}] {verdict}")
    return done


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
    converted = record.get("key") == new_key and record.get(field) in accepted
    if record.get("key") not in accepted and not converted:
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
    fs.write_json(fs.join(stage.folder, schema.STAGE_FILE),
                  {**record, "key": new_key, field: record.get(field, record["key"])})


def teacher_fingerprint(old: dict, labels: Optional[Sequence[str]] = None) -> dict:
    """A layout-1 teacher checkpoint's fingerprint with its engine section whole (teacher.train._checkpoints): the
    flat warm-up and the fields that differed from the teacher's default engine put back into one section; and,
    when the run splits train (`labels`: split.json's), the label set the run now gives a teacher that names none
    (the one the labeled rows gave it then, unless a class had no labeled row)."""
    settings = json.loads(old["settings"])
    if "warmup" not in settings:
        return old  # already whole
    engine = {k: v for k, v in typed.to_dict(TeacherConfig().engine).items() if k != "tracker"}
    engine.update(warmup=settings.pop("warmup"), **settings.pop("engine", {}))
    if labels is not None and settings.get("labels") is None:
        settings["labels"] = list(labels)
    return {**old, "settings": json.dumps({**settings, "engine": engine}, sort_keys=True, default=str)}


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
    else:  # a student's settings under today's names
        settings = renamed(json.loads(saved["fingerprint"]["settings"]), RENAMED)
        saved["fingerprint"] = {**saved["fingerprint"], "settings": json.dumps(settings, sort_keys=True, default=str)}
    torch.save(saved, path + ".partial")
    os.replace(path + ".partial", path)
    with open(os.path.join(folder, CHECKPOINT_FINGERPRINT), "w", encoding="utf-8") as fh:
        json.dump(saved["fingerprint"], fh, sort_keys=True, default=str)
    return True


def today_names(raw: dict) -> dict:
    """A run config's mapping with each student's settings (a search's candidates too) under today's names
    (precedence.RENAMED): the config of a run folder made before, as RUN/config.yaml holds it."""
    def today(section):
        return renamed(section, RENAMED) if isinstance(section, dict) else section

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
    """Convert RUN_DIR's records to today's layout (see the module's docstring); returns convert()'s verdicts."""
    layout = keys.read_layout(run_dir)
    if layout == keys.LAYOUT:
        log(f"{run_dir}: already layout {keys.LAYOUT}; nothing to convert")
        return {"reused": [], "resumed": [], "rerun": []}
    if layout not in RULES:
        raise ConfigError(f"{run_dir}: layout {layout}; this transferset converts layouts 1 and 2 only")
    config = config or fs.join(run_dir, runner.CONFIG_FILE)
    if not fs.exists(config):
        raise ConfigError(f"{run_dir}: no {runner.CONFIG_FILE} (not a run folder?); give the run's --config YAML")
    cfg = runner.load_overridden(today_names(typed.read_yaml(config)), [*overrides, f"run_dir={run_dir}"], config)
    files = runner.resolve_data(cfg.data, cfg.test, cfg.dev)
    with runner.output_lock(run_dir, command="migrate"):
        done = convert(cfg, files, log, RULES[layout])
        keys.write_layout(run_dir)
    log(f"{run_dir}: layout {keys.LAYOUT}; {len(done['reused'])} finished stage(s) kept, {len(done['resumed'])} "
        f"to resume, {len(done['rerun'])} to run again ({', '.join(done['rerun']) or 'none'})")
    return done


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by an earlier transferset")
    parser.add_argument("--config", metavar="YAML",
                        help="the run's config (default: RUN_DIR/config.yaml, the settings of its last run)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the run's key=value overrides, as given to run")


def run(args, extra: Sequence[str]) -> int:
    migrate(args.run_dir, args.config, args.overrides)
    return 0
