"""What a student family provides, and what it is given to build a student.

A family (students/families/bilstm.py, students/families/transformer.py) is what differs between students: how the
model and its tokens are built from the scored set and the teacher, its forward pass over a batch,
its parameter groups (for progressive unfreezing) and how it is saved and loaded. Everything else
(data, losses, phase plans, the training loop, evaluation) is shared and looks a family up by name
in the registry, students/build.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

import torch.nn as nn

from transferset.config import StudentConfig
from transferset.runtime.errors import UserError
from transferset.runtime.registry import Registry

Batch = dict  # str → tensor (and the batch's texts), as made by students.data.make_batch

# Parameter groups, bottom-up, as every family's param_groups names them: progressive unfreezing
# (students/phases.py) thaws them top-down. A family may split "encoder" per layer ("encoder.1", ...:
# the transformer does, for the pkt phase plan); the other phase plans fold the parts back into "encoder".
GROUPS = ("embeddings", "encoder", "head", "classifier")


@dataclass
class Context:
    """What a family's build gets: the settings and what the scored set tells."""

    cfg: StudentConfig
    teacher_dir: Optional[str]       # the teacher's local directory, None when the set's teacher_id is none
    meta: dict                       # the scored set's metadata
    label_names: list[str]
    hidden_width: int                # the teacher's teacher_hidden width
    transfer_dir: str
    column_names: list[str]          # the scored set's columns
    max_length: int                  # tokens per row
    seed: int                        # the run's init stream as an int (e.g. PCA padding)


@dataclass
class Built:
    model: nn.Module
    tokens: Any                      # students.data.tokens.WordPieceTokens or WordTokens
    config: Any                      # the model's own config dataclass (recorded in metrics.json and the sidecar)
    repr_width: int                  # width of the model's "repr" output
    pkd_columns: list[str]           # column of the teacher layer behind each student layer (PKD), else []
    # Student width → teacher width for repr / pkd (see `projection`); None when they match or no loss needs it.
    projection: Optional[nn.Module] = None


@dataclass(frozen=True)
class Family:
    """One student family, registered by its module (`register`): everything that differs between students."""

    name: str  # StudentConfig.student
    build: Callable[[Context], Built]
    forward: Callable[[nn.Module, Batch], dict]                 # → logits (B, C), repr (B, D), ...
    param_groups: Callable[[nn.Module], dict]                   # GROUPS (encoder maybe per layer) → parameters
    save: Callable[[str, nn.Module, Any], dict]                 # (dir, model, tokens) → sidecar entries
    load: Callable[[str, dict], tuple[nn.Module, Any, Any]]     # (dir, sidecar) → (model, tokens, config)
    default_lr: float  # AdamW's peak learning rate when StudentConfig.optim.lr is None
    tokens: tuple[str, ...] = ("wordpiece", "words")  # the StudentConfig.tokens kinds it is built on
    # ONNX export (students/compress/export.py): (model, tokens) → a module taking (input_ids, attention_mask) → logits;
    # None: the model is a Hugging Face classifier, exported with the tokenizer's inputs as they are
    export_graph: Optional[Callable[[nn.Module, Any], nn.Module]] = None
    # The engine settings a student of the family trains with unless its `engine:` section gives them (`settled`):
    # the learning rate's schedule and warm-up (config.StudentEngineConfig); one it leaves out: constant / 0.
    engine: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # What it can do, which the shared code asks instead of its name:
    # per-token hidden states and attention maps, which the layer losses compare (students/losses/online.py)
    layer_losses: bool = False
    # the outputs its forward gives, which a loss reads (students.losses: Loss.reads): a loss reading one it does
    # not give is refused at build (the layer losses' states: by `layer_losses`, students/losses/online.py)
    outputs: tuple[str, ...] = ("logits", "repr")
    # an embedding table built from the teacher's vectors (`embed_init`), kept fixed unless `freeze_embeddings: false`
    teacher_vectors: bool = False
    # (settings, fixed, teacher width) → the model its build makes, untrained and without data: `fixed` holds what
    # the data would (vocab_size, num_classes, pad_id). What `run` times a training step on before any stage
    # (transferset/app/planning/calibrate.py); None: the family is timed otherwise (a transformer, on the teacher's layers)
    shaped: Optional[Callable[[StudentConfig, dict, int], nn.Module]] = None


# Every module of students.families registers its family when the registry is first read; families of other
# packages come through the entry point group (transferset/runtime/registry.py).
FAMILIES: Registry[Family] = Registry("student family", "transferset.families", "students.families")


def register(family: Family) -> Family:
    """Add a family to the registry (by its module, at import); a name registered twice is refused."""
    return FAMILIES.add(family.name, family, by=family.build.__module__)


def get(name: Optional[str], where: str = "student") -> Family:
    """The registered family of that name; an unknown one is a RegistryError (a UserError) naming the known ones."""
    return FAMILIES.get(name, where)


def names() -> list[str]:
    return FAMILIES.names()


# The engine a family's declaration leaves out: a constant rate, no warm-up.
ENGINE_FALLBACK = {"schedule": "constant", "warmup": 0.0}


def settled(cfg: StudentConfig) -> StudentConfig:
    """The settings with what the family decides filled in: the engine fields the `engine:` section leaves unset
    (None) take the family's (`Family.engine`). Every student is trained, and keyed, settled; settling twice
    changes nothing."""
    unset = [name for name in ENGINE_FALLBACK if getattr(cfg.engine, name) is None]
    if not unset:
        return cfg
    declared = {**ENGINE_FALLBACK, **get(cfg.student).engine}
    return replace(cfg, engine=replace(cfg.engine, **{name: declared[name] for name in unset}))


def frozen_embeddings(cfg: StudentConfig) -> bool:
    """Whether the embedding table stays fixed: `freeze_embeddings`, else (None) for a family built on the teacher's
    vectors whose `embed_init` is not random."""
    if cfg.vocab.freeze_embeddings is not None:
        return cfg.vocab.freeze_embeddings
    return get(cfg.student).teacher_vectors and cfg.vocab.embed_init != "random"


def projection(student_width: int, teacher_width: int) -> Optional[nn.Linear]:
    """TinyBERT's W_h (Jiao et al. 2020): a Linear from the student's hidden width to the teacher's, so
    repr and pkd can compare states of different widths; None when the widths match.

    It learns with the student but is no part of the student's model: the saved student stays a model of
    its own width (a plain Hugging Face directory for the transformer), and predicting never needs it.
    """
    if student_width == teacher_width:
        return None
    return nn.Linear(student_width, teacher_width)


def project(outputs: dict, proj: Optional[nn.Module]) -> dict:
    """A family's outputs with repr (B, D) and cls_layers (B, L, D) taken to the teacher's width (B, ..., H)."""
    if proj is None:
        return outputs
    return {k: proj(v) if k in ("repr", "cls_layers") else v for k, v in outputs.items()}


def model_values(defaults: dict, model: Mapping[str, Any], known: set[str], what: str, fixed: dict) -> dict:
    """Model settings: defaults < the config's `model:` (`model`) < what the data fixes (vocabulary, classes)."""
    values = {**defaults, **model, **fixed}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"model: unknown {what} setting(s) {unknown}; known: {sorted(known)}")
    return values
