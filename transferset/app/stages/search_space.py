"""What the run's teacher can give the search (transferset/app/stages/search.py): the candidates, and the early-exit
variants, that it and the scored set it makes cannot, dropped from the space before the first stage, each with why.
The plan says which (estimate.py), search.json records them as refused, and the search trains the rest; a search
left with no candidate is refused (exit 2) before anything runs.

Known from the settings and the teacher's config.json alone, no model built:
- a transformer candidate cut from the teacher takes its layers from it: 1 ≤ n_layer ≤ the teacher's layers, and the
  layers an `init` list names are layers it has (students/families/transformer_maps.py);
- its early exits (NAME+exits@S) take a BERT encoder of two layers or more (students/families/exits.py);
- pkd reads the teacher's hidden states of the layers behind the student's, which the scored set holds only for
  `score.layers` (the last always).
A candidate that starts from a pretrained model (`model.pretrained`) has its own depth and kind: its build decides.
"""
from __future__ import annotations

import functools
import os
from dataclasses import fields
from typing import Any, NamedTuple, Optional

from students.families.transformer import TransformerConfig
from students.families.transformer_maps import teacher_layer_map
from transferset.app.stages.context import teacher_source
from transferset.app.stages.search_timing import exits_variants
from transferset.config import RunConfig, StudentConfig
from transferset.models import loading


@functools.lru_cache(maxsize=8)
def _teacher_config(path: str, trust_remote_code: bool, stamp: float) -> Optional[Any]:
    try:
        return loading.load_config(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - a teacher whose config cannot be read here: its candidates are left to build
        return None


def teacher_config(path: str, trust_remote_code: bool = False) -> Optional[Any]:
    """The teacher's Hugging Face config (read once per version of its config.json), None where it cannot be read."""
    config_json = os.path.join(path, "config.json")
    stamp = os.path.getmtime(config_json) if os.path.isfile(config_json) else 0.0
    return _teacher_config(path, trust_remote_code, stamp)


def described(tconf: Any) -> str:
    return f"a {tconf.num_hidden_layers}-layer {tconf.model_type}"


def _layers(cfg: StudentConfig, depth: int) -> tuple[Optional[TransformerConfig], list[int], Optional[str]]:
    """A transformer candidate's own settings, the teacher layers behind its layers, or why it has none."""
    known = {f.name for f in fields(TransformerConfig)}
    if set(cfg.model) - known:
        return None, [], None  # an unknown setting: its build says so
    own = TransformerConfig(**{**cfg.model, "teacher_layers": depth})
    try:
        return own, teacher_layer_map(own.n_layer, depth, own.init), None
    except ValueError as exc:
        return own, [], str(exc)


def stored_layers(score_layers, depth: int) -> list[int]:
    """The teacher layers whose hidden states a scored set holds: score.layers (negative from the last), the last
    always (teacher_hidden)."""
    return sorted({depth, *(k if k >= 0 else depth + 1 + k for k in score_layers)})


def why_not(cfg: StudentConfig, tconf: Any, score_layers) -> Optional[str]:
    """Why the teacher of config `tconf` cannot give a candidate of settings `cfg` (None: it can, or its build
    decides)."""
    if cfg.student != "transformer" or cfg.model.get("pretrained") is not None:
        return None
    depth = int(tconf.num_hidden_layers)
    own, behind, why = _layers(cfg, depth)
    if why or own is None or not cfg.weight("pkd"):
        return why
    stored = stored_layers(score_layers, depth)
    missing = [k for k in behind if k not in stored]
    if missing:
        return (f"pkd reads the teacher's hidden states of layers {behind}, the scored set holds layers {stored}: "
                f"add {', '.join(map(str, missing))} to score.layers")
    return None


def exits_why_not(cfg: StudentConfig, tconf: Any) -> Optional[str]:
    """Why a transformer candidate cut from the teacher of config `tconf` cannot take early exits (None: it can)."""
    if cfg.model.get("pretrained") is not None:
        return None
    if tconf.model_type != "bert":
        return (f"no early exits: a {tconf.model_type} student; early exits take BERT sequence classifiers "
                "(embeddings, encoder.layer, pooler)")
    own, _, _ = _layers(cfg, int(tconf.num_hidden_layers))
    if own is not None and own.n_layer < 2:
        return "no early exits: one encoder layer; an exit below the top needs at least two"
    return None


class Space(NamedTuple):
    configs: dict[str, StudentConfig]  # the candidates the search times and trains
    dropped: dict[str, str]  # the candidates and early-exit variants (NAME+exits@S) the teacher cannot give → why
    teacher: str  # the teacher in words ("a 2-layer bert"; "" where its config cannot be read)

    def said(self) -> str:
        return "; ".join(f"{name} ({why})" for name, why in self.dropped.items())


def teacher_gives(cfg: RunConfig, configs: dict[str, StudentConfig]) -> Space:
    """The candidates `configs` of the run's search, those its teacher cannot give and the early-exit variants it
    cannot take dropped (a teacher whose config cannot be read drops nothing)."""
    main = teacher_config(teacher_source(cfg), cfg.teacher.trust_remote_code)
    kept, dropped = {}, {}
    for name, c in configs.items():
        tconf = main if c.teacher is None else teacher_config(c.teacher)
        if tconf is None or not hasattr(tconf, "num_hidden_layers"):
            kept[name] = c
            continue
        why = why_not(c, tconf, cfg.score.layers)
        if why:
            dropped[name] = why
            continue
        kept[name] = c
        no_exits = exits_why_not(c, tconf) if exits_variants(name, c, cfg.search) else None
        dropped.update({variant: no_exits for variant in exits_variants(name, c, cfg.search) if no_exits})
    return Space(kept, dropped, described(main) if main is not None and hasattr(main, "num_hidden_layers") else "")
