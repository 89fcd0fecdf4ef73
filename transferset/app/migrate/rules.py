"""The key rules of earlier run-folder layouts, kept for `transferset migrate` (transferset/app/migrate/) only.

Layout 1 keyed a stage by its settings that differ from their defaults, plus the FROZEN ones each key held
when those rules were written, with legacy forms for settings added later and the engine section in the flat
form of before it existed. Layout 2 held every setting at its value, as today's keys do, under the names of
then: a student's phase plan was `schedule`, now `phases` (spellings.RENAMED). Layout 3 is layout 2 under
today's names, with each built-in loss a student setting of its own name (`kd: 1.0`, `temperature: 2.0`): today
every loss is under `losses:` (spellings.LOSS_SETTINGS), in the canonical form of students.losses.canonical.
No earlier layout knew `teacher.patience`: every teacher ran every epoch, the work of `patience: null` (ADDED_SINCE).
Layout 4 is today's but for three forms: it keyed a teacher's engine precision `auto` as `fp32` and left a score
stage's precision out at `auto` or `fp32` (so that folders made before `auto` kept their keys; today each is keyed
at its value), held the teacher's, prune's and exits' optimizer settings at the top of their sections (today under
`optim:`), and a BiLSTM's named shape as `preset: tang` (today `model: {shape: tang}`); every earlier layout held
those two as layout 4 did. Layout 5 is today's but for a student's tokens, data and report settings, which it held
at the top of the student's settings (today the `vocab:`, `data:` and `report:` sections: `flat_sections`); every
earlier layout held them so. Each layout's rules are a class with the names build_plan calls (V1 to V5);
`flat_student` and `grouped_student` turn a student's settings from one form into the other.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

from transferset import augment as augment_ops
from transferset.app.stages import keys
from transferset.config import OptimConfig
from transferset.contract import schema
from transferset.app.migrate.spellings import LOSS_SETTINGS, OPTIM_SETTINGS, RENAMED, SHAPE_PRESETS, STUDENT_SECTIONS
from transferset.config.precedence import DEFAULT_LOSSES, STUDENT_PRESETS, loss_weight
from transferset.runtime import typed

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
    `engine` says, its `optim:` section as `flat_optim` does."""
    values, defaults = flat_optim(kind, typed.to_dict(cfg)), flat_optim(kind, _defaults(type(cfg)))
    if kind == "student":
        values, defaults = earlier_names(flat_student(values)), earlier_names(flat_student(defaults))
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

# The fields of the teacher's, prune's and exits' `optim:` section (config.TrainerOptimConfig) that came with it, at
# the value every earlier run of that trainer had (the teacher clipped its gradients at 1.0; exits' AdamW decayed
# its weights at torch's 0.01 and clipped nothing); the others (lr, weight_decay; prune's grad_clip too) were
# settings of the trainer's own.
OPTIM_ADDED: dict[str, dict[str, Any]] = {"teacher": {"grad_clip": 1.0}, "prune": {},
                                          "exits": {"weight_decay": 0.01, "grad_clip": 0.0}}


def flat_optim(kind: str, values: dict) -> dict:
    """A teacher's, prune's or exits' settings (`kind`) with its `optim:` fields at the top, as layouts 1 to 4 held
    them: a field the section brought (OPTIM_ADDED) out at the value every earlier run had, in at any other (then
    no earlier key holds it: the stage runs again). Any other kind's settings as they are."""
    if kind not in OPTIM_ADDED or not isinstance(values.get("optim"), dict):
        return values
    added = OPTIM_ADDED[kind]
    flat = {k: v for k, v in values.items() if k != "optim"}
    flat.update({k: v for k, v in values["optim"].items() if k not in added or added[k] != v})
    return flat


def grouped_optim(values: dict, names: Sequence[str]) -> dict:
    """A teacher's, prune's or exits' settings (a mapping, whole or partial) with `names` (those the trainer had of
    its own: spellings.TRAINER_OPTIM) under `optim:`, over what the section gives already."""
    return grouped_sections(values, {"optim": names})


# Settings added after the earlier layouts, with the value every stage those layouts keyed ran at, which is not
# always today's default: out of an earlier key at that value, in it at any other (no earlier record holds one
# then: the stage runs again). Every teacher before `patience` ran every epoch, as `patience: null` does; today's
# default, 1, stops early, which is other work.
ADDED_SINCE: dict[str, dict[str, Any]] = {"teacher": {"patience": None}}


def as_then(kind: str, settings: dict, cfg: Any) -> dict:
    """`settings` with each of ADDED_SINCE[kind] out at the value of then, at its value (`cfg`'s) otherwise."""
    added = ADDED_SINCE.get(kind, {})
    out = {k: v for k, v in settings.items() if k not in added}
    out.update({k: getattr(cfg, k) for k, then in added.items() if getattr(cfg, k) != then})
    return out


def teacher(tc: Any) -> dict:
    """A trained teacher's key settings (checkpoint_steps: EXECUTION; patience as ADDED_SINCE says)."""
    return as_then("teacher", section("teacher", tc), tc)


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
        settings["losses"] = {k: v for k, v in settings["losses"].items() if loss_weight(v)}
        if not settings["losses"]:
            del settings["losses"]
    if layer_texts_set is not None:
        settings["layer_texts_set"] = layer_texts_set
    return settings


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
    """A student's settings under the names layouts 1 and 2 knew (spellings.RENAMED, backwards)."""
    return renamed(settings, {new: old for old, new in RENAMED.items()})


# --- the layout-5 rules: today's, with a student's vocab:, data: and report: fields at the top of its settings ----

def flat_sections(values: dict) -> dict:
    """A student's settings (today's) with the fields of its `vocab:`, `data:` and `report:` sections at the top of
    its settings, as layouts 1 to 5 held them (spellings.STUDENT_SECTIONS)."""
    out = {k: v for k, v in values.items() if k not in STUDENT_SECTIONS}
    for name in STUDENT_SECTIONS:
        out.update(values.get(name) or {})
    return out


class V5:
    """The layout-5 key rules: today's, with a student's tokens, data and report settings at the top of its settings
    (`flat_sections`)."""

    data, augment, teacher, score, compressed = staticmethod(keys.data), staticmethod(keys.augment), \
        staticmethod(keys.teacher), staticmethod(keys.score), staticmethod(keys.compressed)
    FIELD = "layout5_key"

    @staticmethod
    def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
        return flat_sections(keys.student(s_cfg, layer_texts_set))


# --- the layout-4 rules: layout 5's, with precision `auto` keyed as fp32 and two settings in their earlier places ---

class V4:
    """The layout-4 key rules: today's, but a teacher's engine precision `auto` (the default) keyed as `fp32`, and a
    score stage's precision out of its key at `auto` or `fp32` (a scored set's metadata leaves fp32 unrecorded):
    `auto` came after folders trained and scored at fp32 existed, and layout 4 kept their keys; the teacher's,
    prune's and exits' optimizer settings at the top of their sections (`flat_optim`); a BiLSTM's named shape its
    `preset` (`preset_shape`)."""

    data, augment = staticmethod(keys.data), staticmethod(keys.augment)
    FIELD = "layout4_key"

    @staticmethod
    def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
        return preset_shape(V5.student(s_cfg, layer_texts_set))

    @staticmethod
    def compressed(kind: str, cfg: Any) -> dict:
        return flat_optim(kind, keys.compressed(kind, cfg))

    @staticmethod
    def teacher(tc: Any) -> dict:
        settings = flat_optim("teacher", keys.teacher(tc))
        engine = settings.get("engine")
        if isinstance(engine, dict) and engine.get("precision") == "auto":
            settings["engine"] = {**engine, "precision": "fp32"}
        return settings

    @staticmethod
    def score(sc: Any, members: int) -> dict:
        settings = keys.score(sc, members)
        if settings.get("precision") in (schema.UNRECORDED_PRECISION, "auto"):
            settings.pop("precision")
        return settings


class V3:
    """The layout-3 key rules: layout 4's, with a student's settings in the flat form (`flat_student`)."""

    data, augment, score, compressed = V4.data, V4.augment, V4.score, V4.compressed
    FIELD = "layout3_key"

    @staticmethod
    def teacher(tc: Any) -> dict:
        """A trained teacher's key settings as layouts 2 and 3 held them: layout 4's, patience as ADDED_SINCE says."""
        return as_then("teacher", V4.teacher(tc), tc)

    @staticmethod
    def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
        """A student's key settings as layout 3 held them: every setting at its value, the flat losses among them,
        `losses` the others with a non-zero weight."""
        settings = flat_student(keys.section(s_cfg))
        if settings.get("losses"):
            settings["losses"] = {k: v for k, v in settings["losses"].items() if loss_weight(v)}
        if layer_texts_set is not None:
            settings["layer_texts_set"] = layer_texts_set
        return settings


class V2:
    """The layout-2 key rules: layout 3's under the names of then."""

    data, teacher, augment, score, compressed = V3.data, V3.teacher, V3.augment, V3.score, V3.compressed
    FIELD = "layout2_key"

    @staticmethod
    def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
        return earlier_names(V3.student(s_cfg, layer_texts_set))


# a run folder's layout (None: no record, layout 1) → the rules its keys were made by
RULES = {None: V1, 2: V2, 3: V3, 4: V4, 5: V5}


# --- a student's settings in the two forms ------------------------------------------------------------

def flat_student(values: dict) -> dict:
    """A student's settings (today's, as typed.to_dict gives them) in the form of layouts 1-3: the `optim:` section's
    fields settings of the student's own; each loss of LOSS_SETTINGS a setting of its own name (0.0 where `losses:`
    names none), kd's temperature the setting `temperature`, `losses` the other losses (those a package
    registers); a BiLSTM's named shape its `preset` (`preset_shape`)."""
    values = preset_shape(flat_sections(values))
    out = {k: v for k, v in values.items() if k not in ("losses", "optim")}
    # the optimizer's settings added after layout 3 (ema) were in no earlier record: out at their default
    later = {f.name: f.default for f in dataclasses.fields(OptimConfig) if f.name not in OPTIM_SETTINGS}
    out.update({k: v for k, v in (values.get("optim") or {}).items() if k not in later or v != later[k]})
    others = dict(values.get("losses") or {})
    for name in LOSS_SETTINGS:
        out[name] = loss_weight(others.pop(name, 0.0))
    kd = (values.get("losses") or {}).get("kd")
    out["temperature"] = float(kd.get("temperature", 1.0)) if isinstance(kd, dict) else 1.0
    out["losses"] = others
    return out


def grouped_student(values: dict) -> dict:
    """A student's settings in the form of layouts 1-3 (a mapping, whole or partial) in today's: the optimizer's
    settings it names under `optim:`; the losses of LOSS_SETTINGS it names (zero weights too: they override a
    preset's) and kd's temperature under `losses:` with the others it held there. A mapping that names a loss but
    not ce or mse, and no preset that sets losses, gets them at their earlier default, 1.0, which it trained with. A
    BiLSTM's `preset: NAME` its named shape (`shape_of_preset`); its tokens, data and report settings under
    `vocab:`, `data:` and `report:` (layout 5's form too: `grouped_sections`)."""
    values = grouped_sections(shape_of_preset(values), {**STUDENT_SECTIONS, "optim": OPTIM_SETTINGS})
    out = dict(values)
    if not any(n in values for n in LOSS_SETTINGS) and "temperature" not in values:
        return out
    losses = {n: values[n] for n in LOSS_SETTINGS if n in values}
    if values.get("preset") not in STUDENT_PRESETS:  # a preset that sets losses names its own
        losses = {**{n: w for n, w in DEFAULT_LOSSES.items() if n not in losses}, **losses}
    if "temperature" in values:
        losses["kd"] = {"weight": losses.get("kd", 0.0), "temperature": values["temperature"]}
    out = {k: v for k, v in out.items() if k not in LOSS_SETTINGS and k != "temperature"}
    out["losses"] = {**losses, **(values.get("losses") or {})}
    return out


def grouped_sections(values: dict, sections: dict[str, Sequence[str]]) -> dict:
    """A trainer's settings (a mapping, whole or partial) with each setting `sections` names ({section: its
    settings}) under its section, over what the section gives already."""
    out = dict(values)
    for name, fields in sections.items():
        moved = {k: out.pop(k) for k in fields if k in out}
        if moved:
            given = out.get(name) if isinstance(out.get(name), dict) else {}
            out[name] = {**moved, **given}
    return out


def preset_shape(values: dict) -> dict:
    """A student's settings (today's) with a BiLSTM's named shape (`model: {shape: NAME}`) as layouts 1 to 4 held
    it: `preset: NAME`, `model:` without it."""
    model = values.get("model")
    if not isinstance(model, dict) or "shape" not in model:
        return values
    return {**values, "preset": model["shape"], "model": {k: v for k, v in model.items() if k != "shape"}}


def shape_of_preset(values: dict) -> dict:
    """A student's settings of before (a mapping, whole or partial) with `preset: NAME` of a BiLSTM's named shape
    (spellings.SHAPE_PRESETS) as today's `model: {shape: NAME}`."""
    if values.get("preset") not in SHAPE_PRESETS:
        return values
    model = values.get("model") if isinstance(values.get("model"), dict) else {}
    return {**{k: v for k, v in values.items() if k != "preset"}, "model": {"shape": values["preset"], **model}}
