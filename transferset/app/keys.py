"""What each stage's key holds: the one table of key rules of `transferset run` (transferset/app/runner.py).

A stage is reused when its key is unchanged (runner.StageDef), so a key must hold what the stage's output
depends on and nothing else. The general rule: a section's settings enter its stage's key only when they
differ from their defaults, so adding a setting (a loss weight, an augment op's settings) changes no
existing key. The exception is FROZEN: the settings each key held at 7b25072, when this table was written,
stay in it at any value, so the run directories made before keep their keys (tests/transferset/app/
test_keys_frozen.py holds those keys). The other rules below are older compatibility rules, one function
each, each with its test in tests/transferset/app/test_keys.py.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

from transferset import augment as augment_ops
from transferset import typed
from transferset.config.engine import flat_form

# The settings each section's key held at 7b25072, whatever their value. A setting added since is out of
# the key while at its default; do not add to these lists (that would change every existing key).
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


@functools.cache
def _defaults(cls: type) -> dict[str, Any]:
    return typed.to_dict(cls())


def section(kind: str, cfg: Any) -> dict[str, Any]:
    """A section's settings as its key holds them: FROZEN ones always, any other only when it differs from its
    default, EXECUTION ones (and the config's own EXECUTION tuple) never; a trainer's engine section as
    `engine` says."""
    values, defaults = typed.to_dict(cfg), _defaults(type(cfg))
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
# default became a linear warm-up and decay (config.engine.STUDENT_ENGINE, issue 44) after every student had
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
    7b25072 were in every key), so installing an op changes no key; words_per_variant came after run
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
