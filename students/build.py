"""The ONE registry of student families, and setting a student up from a scored set.

What a family provides is described in students/families/__init__.py; each family's module
(students/families/bilstm.py, students/families/static.py, students/families/transformer.py) builds, runs, saves
and loads its students.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from students import families as family_registry
from students import seeds
from students.data import ScoredSet, teacher_files
from students.families import Context, Family
from students import losses
from students.losses import LossWeights, online
from students.phases import PLANS
from transferset.config import DEFAULT_MAX_LENGTH, StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.runtime.threads import set_torch_threads

# Each family's module registers it (students.families.register) when the registry is first read, by name.
FAMILIES = family_registry.FAMILIES
# A Hugging Face classifier saved by someone else (e.g. the teacher): predicts like the transformer.
HF_FAMILY = FAMILIES["transformer"]


def family(name: Optional[str], where: str = "student") -> Family:
    return family_registry.get(name, where)


@dataclass
class Setup:
    cfg: StudentConfig
    family: Family
    model: nn.Module
    model_config: Any
    tokens: Any
    label_names: list[str]
    meta: dict
    pkd_columns: list[str]           # column of the teacher layer behind each student layer (PKD), else []
    num_rows: int
    num_labeled: int
    # repr / pkd across widths: student → teacher width, trained with the student, never saved (family.projection)
    projection: Optional[nn.Module] = None
    # The teacher run alongside for the layer losses, with W_h (students/losses/online.py); None when none is set.
    online: Optional[nn.Module] = None


def check_outputs(fam: Family, cfg: StudentConfig) -> None:
    """Refuse a loss that reads an output the family does not give (Loss.reads against Family.outputs), naming the
    families that do; the layer losses are the online teacher's to refuse (students/losses/online.py)."""
    for name in LossWeights.of(cfg).active():
        loss = losses.get(name)
        missing = [key for key in loss.reads if key not in fam.outputs]
        if loss.role != losses.LAYER and missing:
            givers = [f.name for f in family_registry.FAMILIES.values() if set(loss.reads) <= set(f.outputs)]
            raise UserError(f"{name} loss needs a {' or '.join(givers) or 'other'} student"
                            f"{f' (`--student {givers[0]}`)' if givers else ''}: it reads the student's "
                            f"{', '.join(missing)}, which the {fam.name} student does not give")


def setup(cfg: StudentConfig, scored: Union[str, ScoredSet]) -> Setup:
    """Build tokens and the student (initialised from the teacher if asked) for the scored set (its path: opened
    here, an unfinished one too)."""
    fam = family(cfg.student, "student")
    cfg = family_registry.settled(cfg)
    if cfg.phases not in PLANS:
        raise UserError(f"unknown phases {cfg.phases!r}; known: {', '.join(PLANS.names())}")
    if isinstance(scored, str):
        scored = ScoredSet.open(scored, allow_incomplete=True)
    meta, label_names, hidden_width = scored.meta, scored.label_names, scored.hidden_width
    set_torch_threads(cfg.threads)
    check_outputs(fam, cfg)

    max_length = cfg.data.max_length or int(meta.get(schema.META_MAX_LENGTH) or DEFAULT_MAX_LENGTH)
    init_seed = seeds.torch_seed(seeds.stream(cfg.seed, seeds.INIT))
    ctx = Context(cfg, teacher_files.teacher_dir(cfg, meta), meta, label_names, hidden_width, scored.path,
                  scored.column_names, max_length, init_seed)
    # The caller's torch random state is left as it was: the init stream is the run's own.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        built = fam.build(ctx)  # a family's build may refuse other tokens with its own reason first
        if cfg.vocab.tokens not in fam.tokens:
            raise UserError(f"the {fam.name} student is built on `vocab: {{tokens: {' | '.join(fam.tokens)}}}`; drop "
                            f"`vocab: {{tokens: {cfg.vocab.tokens}}}`")
        online_teacher = online.make(ctx, built)
    if (cfg.weight("repr") or cfg.phases == "progressive") and built.repr_width != hidden_width \
            and built.projection is None:
        raise UserError(f"the representation loss (repr, and stage 1 of the progressive phase plan) needs the "
                        f"student's head width ({built.repr_width}) to equal the teacher's hidden width "
                        f"({hidden_width}); drop the head_dim / shape override, or repr from `losses:`")
    return Setup(cfg, fam, built.model, built.config, built.tokens, label_names, meta, built.pkd_columns,
                 scored.num_rows, scored.num_labeled, built.projection, online_teacher)
