"""Where a setting gets its value: one order, written here once (docs/configuration.md renders STUDENT_LAYERS).

Every section of a run config and every command takes what the user gave in this order, each layer over
the one below, setting by setting: the file, then the command's flags, then `key=value` words (`over`,
`apply_override`). A section (`optim:`, `engine:`, `model:`, `losses:`) merges key by key, so `--warmup 0.2`
over a file's `engine: {schedule: cosine}` keeps the cosine, and `losses:` merges loss by loss, a loss's own
settings key by key (a weight alone, `losses.kd=2`, keeps the temperature of the layer below). A student's
settings have two layers below those (`resolve_student`, which every load of a StudentConfig goes through: its
validator calls it): the defaults, its family's among them, and the preset the layers above name.
(`StudentConfig(...)` in Python is a plain dataclass: it holds the values it is given and the field defaults, no
preset; `typed.load(StudentConfig, {...})` takes the layers.)

A family's defaults are declared by the family (students/families/: this layer sits below the students and
does not know them) and read where they are used, each left unset (None) in the settings until then: the
learning rate (`optim: {lr: null}`: the family's `default_lr`, where the optimizer is made), the learning
rate's curve (`engine: {schedule: null, warmup: null}`: the family's `engine`, `students.families.settled`,
which every training and every student's stage key goes through) and the shape of its model (`model:`, a BiLSTM's
named shape among its settings, over the family's defaults where the model is built: students.families).
"""
from __future__ import annotations

import copy
from importlib import resources
from typing import Any, Mapping

import yaml

from transferset.runtime import typed
from transferset.runtime.errors import ConfigError

# A student's layers, lowest first: (layer, what sets it).
STUDENT_LAYERS: tuple[tuple[str, str], ...] = (
    ("default", "the setting's default (this page), or its family's where the family has one: the `engine:` "
                "section (a BiLSTM or static student warms up over 10 % of each phase's steps, then decays "
                "linearly; a transformer keeps a constant rate), the learning rate (`optim: {lr: null}`: BiLSTM and "
                "static 2e-3, transformer 1e-4) and the model's shape (`model:`)"),
    ("preset", "`preset: NAME`: a transformer preset's settings, the YAML file transferset/config/presets/NAME.yaml "
               "(tinybert, mobilebert, minilm, distilbert, pkd; each also chooses `student: transformer`); a BiLSTM's "
               "named shape is a model setting: `model: {shape: tang}`"),
    ("file", "the YAML: `transferset train --config FILE`, or a run config's `students.NAME:` (the starter "
             "`transferset init` writes, and `run --data` runs, is one)"),
    ("flags", "`transferset train --epochs 3`, and a section's field by its own name: `--lr 1e-3` (`optim:`), "
              "`--warmup 0.2`, `--schedule cosine` (`engine:`)"),
    ("key=value", "`transferset train ... optim.lr=1e-3 engine.warmup=0.2 losses.kd=2`, `transferset run ... "
                  "students.NAME.optim.lr=1e-3`"),
)

DEFAULT_FAMILY = "bilstm"  # StudentConfig.student

# Transformer presets (`preset: NAME`): a published recipe's settings, the layer under the file's, each a YAML file
# of transferset/config/presets/ (NAME.yaml, its paper and what it sets in its comments). Paper settings and what
# differs here: README.md, "Layer-wise transfer with the teacher online, and the presets". A preset does not set
# the learning-rate schedule: transformer students train at their family's constant rate
# (students/families/transformer.py); the papers' own schedules are listed in docs/scaling.md, with the setting
# that trains as published.
PRESETS_DIR = "presets"


def read_presets() -> dict[str, dict[str, Any]]:
    """NAME → the settings of transferset/config/presets/NAME.yaml, by name."""
    folder = resources.files("transferset.config") / PRESETS_DIR
    found = sorted(f for f in folder.iterdir() if f.name.endswith(".yaml"))
    return {f.name[:-len(".yaml")]: typed.yaml_load(f.read_text(encoding="utf-8")) for f in found}


STUDENT_PRESETS: dict[str, dict[str, Any]] = read_presets()


def over(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged, each over the ones before it (a copy): a mapping over a mapping merges key by key, a
    section left empty (`engine:` with nothing under it, null) keeps the one below, any other value replaces."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            below = out.get(key)
            if isinstance(below, dict) and isinstance(value, Mapping):
                out[key] = over(below, value)
            elif not (isinstance(below, dict) and value is None):
                out[key] = copy.deepcopy(value)
    return out


def resolve_student(*given: Mapping[str, Any]) -> dict[str, Any]:
    """A student's settings: the layers the user gave (lowest first: file, flags, key=value) over the preset
    they name (the defaults below them are the fields' own, and the family's where it has some: students.families
    settles them). `losses:` merges loss by loss and, within a loss, setting by setting: a weight alone
    (`losses.kd=2`) over a preset's `kd: {weight: 1.0, temperature: 5.0}` keeps the temperature."""
    top = over(*map(_losses_as_mappings, given))
    name = top.get("preset")
    preset = _losses_as_mappings(STUDENT_PRESETS.get(name, {}) if isinstance(name, str) else {})
    return over(preset, top)


def _losses_as_mappings(layer: Mapping[str, Any]) -> Mapping[str, Any]:
    """A layer whose `losses:` gives each loss as a mapping ({kd: 2.0} → {kd: {weight: 2.0}}), so layers merge it."""
    losses = (layer or {}).get("losses")
    if not isinstance(losses, Mapping):
        return layer
    return {**layer, "losses": {k: v if isinstance(v, Mapping) else {"weight": v} for k, v in losses.items()}}


# A student's losses when no layer names any (`losses:` unset): Tang et al.'s CE on gold labels plus MSE on logits.
DEFAULT_LOSSES = {"ce": 1.0, "mse": 1.0}


def loss_weight(value: Any) -> float:
    """The weight of one entry of `losses:`, a weight or {weight: W, ...its settings} (no weight: 0.0). Its checks
    and its settings: students.losses."""
    return float(value.get("weight", 0.0) if isinstance(value, Mapping) else value)

def student_values(values: Any) -> Any:
    """StudentConfig's validator: the mapping it is loaded from (typed.load: a file, flags, key=value) resolved (a
    setting under an earlier spelling is an unknown one here: transferset/app/migrate/spellings.py says what it is
    now)."""
    if not isinstance(values, dict):
        return values
    return resolve_student(values)


def apply_override(raw: dict, item: str) -> None:
    """`a.b.c=value` (a YAML value), the key=value layer, set into a raw mapping of the layers below."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. teacher.epochs=1")
    key, text = item.split("=", 1)
    try:
        value = typed.yaml_load(text) if text else None
    except typed.DuplicateKeyError as exc:
        raise ConfigError(f"override {item!r}: {exc.problem}") from None
    except yaml.constructor.ConstructorError as exc:
        raise ConfigError(f"override {item!r}: {exc.problem}; a setting holds plain values "
                          "(no !!python tags or other objects)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML: {' '.join(str(exc).split())}") from None
    node = raw
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        if node.get(p) is None:
            node[p] = {}
        elif i and parts[i - 1] == "losses" and not isinstance(node[p], dict):
            node[p] = {"weight": node[p]}  # `losses.kd.temperature=2` over `kd: 1.0`: its weight kept
        elif not isinstance(node[p], dict):
            where = ".".join(parts[:i + 1])
            raise ConfigError(f"override {item!r}: {where} is {node[p]!r}, not a section, so it has no "
                              f"setting {parts[i + 1]!r}; set {where}=VALUE instead")
        node = node[p]
    if len(parts) > 1 and parts[-2] == "losses" and isinstance(node.get(parts[-1]), dict) \
            and not isinstance(value, dict):
        value = {**node[parts[-1]], "weight": value}  # `losses.kd=2` over `kd: {weight: 1, temperature: 5}`
    node[parts[-1]] = value
