"""What each stage's key holds: the key rules of `transferset run` (transferset/app/run/runner.py).

A stage is reused when its key is unchanged, so a key holds everything the stage's output depends on: the
settings the stage uses, each at its value (a setting at its default included, so changing a default changes
the key and the stage runs again), the content of the files it reads, and its upstream stages' keys. Settings
that change how a stage runs but never what it writes (EXECUTION) are in no key.

A run folder records the layout of its keys (LAYOUT, in RUN/.transferset-run.json); a folder written under
other rules is refused with the command that converts it (`transferset migrate`, transferset/app/migrate/).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from students.losses import canonical
from transferset import augment as augment_ops
from transferset import fs
from transferset.runtime import typed

LAYOUT = 6  # the version of these rules and of a run folder's records
LAYOUT_FILE = ".transferset-run.json"  # RUN/LAYOUT_FILE: {"layout": LAYOUT}
DAMAGED = -1  # read_layout: a record that names no layout (layout 1 wrote none, so one naming 1 or less is damaged)


@runtime_checkable
class KeyRules(Protocol):
    """What a stage's key holds, by kind: this module's functions (today's rules), or an earlier layout's that
    `transferset migrate` plans with (transferset/app/migrate/rules.py) to tell which stages a folder can reuse."""

    def data(self, cfg: Any, train: str) -> dict: ...
    def teacher(self, tc: Any) -> dict: ...
    def augment(self, a: Any, exclude: Sequence[str]) -> dict: ...
    def score(self, sc: Any, members: int) -> dict: ...
    def student(self, s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict: ...
    def compressed(self, kind: str, cfg: Any) -> dict: ...


# Settings in no key: they change how a stage runs, never what it writes. A config class may declare more in
# its own EXECUTION tuple (the augment ops: batch sizes, threads, trust flags).
EXECUTION = ("resume", "progress", "checkpoint_steps")


def section(cfg: Any) -> dict[str, Any]:
    """A section's settings as its key holds them: every one at its value, but the EXECUTION ones."""
    never = set(EXECUTION) | set(getattr(cfg, "EXECUTION", ()))
    return {k: v for k, v in typed.to_dict(cfg).items() if k not in never}


def compressed(kind: str, cfg: Any) -> dict:
    """A `compress:` stage's settings (`kind`: exits or prune)."""
    return section(cfg)


def teacher(tc: Any) -> dict:
    """A trained teacher's settings (its engine's precision at its value: `auto` is not `fp32`)."""
    return section(tc)


def augment(a: Any, exclude: Sequence[str]) -> dict:
    """An augment stage's key: the settings its rows depend on (an op the run does not use adds none of its own)
    and the content (fingerprints) of the files it excludes."""
    used = {f.name for name in a.ops for f in dataclasses.fields(augment_ops.get(name).settings)}
    unused = {f.name for cls in augment_ops.settings_classes() for f in dataclasses.fields(cls)} - used
    return {"settings": {k: v for k, v in section(a).items() if k not in unused}, "exclude": list(exclude)}


def score(sc: Any, members: int) -> dict:
    """A score stage's settings: `combine` only with a teacher ensemble (one teacher's logits whatever the rule)."""
    settings = section(sc)
    if members <= 1:
        settings.pop("combine", None)
    return settings


def student(s_cfg: Any, layer_texts_set: Optional[str] = None) -> dict:
    """A student's settings; `layer_texts_set`: the fingerprint of the layer_texts set it reads (a set the run does
    not make), so a set written again at the same path retrains it. `losses` in its canonical form
    (students.losses.canonical: the losses with a non-zero weight, each setting at its value): a loss at weight 0
    trains nothing, and `kd: 1` is `kd: {weight: 1.0, temperature: 1.0}`."""
    settings = section(s_cfg)
    settings["losses"] = canonical(settings["losses"])
    if layer_texts_set is not None:
        settings["layer_texts_set"] = layer_texts_set
    return settings


def data(cfg: Any, train: str) -> dict:
    """The data stage's key: the train file's fingerprint and how the run splits it."""
    return {"train": train, "labeled_limit": cfg.labeled_limit, "unlabeled_rows": cfg.unlabeled_rows,
            "lowres": section(cfg.lowres) if cfg.lowres else None,
            "validation": section(cfg.validation) if cfg.validation else None,
            "unlabeled_limit": cfg.unlabeled_limit}


# --- the run folder's layout -----------------------------------------------------------------------

def read_layout(run_dir: str) -> Optional[int]:
    """The layout RUN records (None: no record; DAMAGED: a record that names no layout)."""
    path = fs.join(run_dir, LAYOUT_FILE)
    if not fs.exists(path):
        return None
    try:
        layout = int(fs.read_json(path)["layout"])
    except (ValueError, KeyError, TypeError, OverflowError, json.JSONDecodeError):
        return DAMAGED
    return layout if layout > 1 else DAMAGED


def write_layout(run_dir: str) -> None:
    fs.write_json(fs.join(run_dir, LAYOUT_FILE), {"layout": LAYOUT})
