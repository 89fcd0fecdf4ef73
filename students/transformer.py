"""Small Transformer student (BERT-PKD, Sun et al. 2019): the teacher's own Hugging Face
architecture with k layers.

The student is `AutoModelForSequenceClassification.from_config(teacher config)` with
`num_hidden_layers = k` and the task's label names, so a trained student is a normal Hugging Face
model directory (`from_pretrained`, `pipeline("text-classification")` load it without transferset).
It starts from the teacher: embeddings, every m-th teacher layer ("skip", m = teacher layers // k,
so the top teacher layer is always kept) or the first k ("first"), the pooler and, when its shape
fits, the classifier; or from random weights ("random", the teacher's architecture only).
It uses the teacher's full vocabulary and tokenizer: a trimmed one would make the saved directory
something other than a plain Hugging Face model.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, fields
from typing import Mapping, Optional, Sequence

import torch
import torch.nn as nn


@dataclass
class TransformerConfig:
    n_layer: int = 3                # k: half of a 6-layer MiniLM teacher
    init: str = "skip"              # "skip" (PKD), "first" (first k teacher layers) or "random"
    copy_classifier: bool = True    # also copy the teacher's classifier when its shape fits
    dropout: Optional[float] = None  # hidden and attention dropout (None: the teacher's)
    teacher_layers: int = 6         # layers of the teacher it is initialised / distilled from (set from its config)


# Parameter groups, bottom-up: progressive unfreezing thaws them top-down.
GROUPS = ("embeddings", "encoder", "head", "classifier")
INITS = ("skip", "first", "random")


def config_fields() -> set[str]:
    return {f.name for f in fields(TransformerConfig)}


def teacher_layer_map(n_layer: int, teacher_layers: int, init: str) -> list[int]:
    """Teacher layer (1-based, as in `teacher_hidden_l{k}` / hidden_states[k]) behind each student layer."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if not 1 <= n_layer <= teacher_layers:
        raise ValueError(f"a {n_layer}-layer student cannot take layers from a {teacher_layers}-layer teacher")
    if init == "first":
        return list(range(1, n_layer + 1))
    # "skip", and also the PKD targets of a randomly initialised student.
    m = teacher_layers // n_layer
    return [m * (j + 1) for j in range(n_layer)]


def build(teacher_config, config: TransformerConfig, label_names: Sequence[str]) -> nn.Module:
    """A randomly initialised k-layer copy of the teacher's architecture with a head for `label_names`."""
    from transformers import AutoModelForSequenceClassification

    c = copy.deepcopy(teacher_config)  # the teacher's config stays intact
    c.num_hidden_layers = config.n_layer
    c.num_labels = len(label_names)
    c.id2label = {i: str(n) for i, n in enumerate(label_names)}
    c.label2id = {str(n): i for i, n in enumerate(label_names)}
    c.architectures = None  # from_config sets the sequence-classification class on save
    if config.dropout is not None:
        c.hidden_dropout_prob = c.attention_probs_dropout_prob = config.dropout
    return AutoModelForSequenceClassification.from_config(c)


def _teacher_key(state: Mapping[str, torch.Tensor], prefix: str, rest: str) -> Optional[str]:
    """The teacher's name for base-model parameter `rest`: with the task model's prefix (bert.) or without (BertModel)."""
    for key in (f"{prefix}.{rest}", rest):
        if key in state:
            return key
    return None


def load_teacher(model: nn.Module, state: Mapping[str, torch.Tensor], layers: Sequence[int],
                 copy_classifier: bool = True) -> list[str]:
    """Copy the teacher's embeddings, its 1-based `layers` (one per student layer), pooler and classifier.

    `state` is the teacher's state dict, of the task model (bert.encoder...) or the base model
    (encoder...). Embeddings and the chosen layers must all be there; the pooler and classifier
    are copied when present with the same shape. → the student's parameter names that were copied.
    """
    if len(layers) != model.config.num_hidden_layers:
        raise ValueError(f"{len(layers)} teacher layers given for {model.config.num_hidden_layers} student layers")
    prefix = model.base_model_prefix
    own = model.state_dict()
    copied, missing = [], []
    with torch.no_grad():
        for name, param in own.items():
            if name.startswith(prefix + "."):
                rest = name[len(prefix) + 1:]
                parts = rest.split(".")
                if parts[:2] == ["encoder", "layer"]:
                    parts[2] = str(layers[int(parts[2])] - 1)   # student layer j ← teacher layer layers[j]
                required = parts[0] in ("embeddings", "encoder")
                theirs = _teacher_key(state, prefix, ".".join(parts))
            else:  # the task head (classifier) lives outside the base model
                required = False
                theirs = name if copy_classifier and name in state else None
            if theirs is None:
                if required and not name.endswith(("position_ids", "token_type_ids")):
                    missing.append(name)
                continue
            src = state[theirs]
            if src.shape != param.shape:
                if required:
                    raise ValueError(f"teacher {theirs} has shape {tuple(src.shape)}, the student's {name} "
                                     f"{tuple(param.shape)}")
                continue  # e.g. a classifier for another number of labels: keep the fresh one
            param.copy_(src)
            copied.append(name)
    if missing:
        raise ValueError(f"teacher weights lack {missing[:3]}{' ...' if len(missing) > 3 else ''}; "
                         "is the teacher a BERT-style encoder?")
    return copied


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """embeddings / encoder / head (the pooler and anything else of the base model) / classifier."""
    prefix = model.base_model_prefix + "."
    groups: dict[str, list[nn.Parameter]] = {g: [] for g in GROUPS}
    for name, p in model.named_parameters():
        if not name.startswith(prefix):
            groups["classifier"].append(p)
        elif name[len(prefix):].startswith("embeddings."):
            groups["embeddings"].append(p)
        elif name[len(prefix):].startswith("encoder."):
            groups["encoder"].append(p)
        else:
            groups["head"].append(p)
    return groups


def forward(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            type_ids: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """Any Hugging Face sequence classifier → logits, repr and the [CLS] state of every layer."""
    kwargs = {"input_ids": ids, "attention_mask": mask.long(), "output_hidden_states": True}
    # DistilBERT-like models take no token types; a pair's types only matter to models that have them.
    if type_ids is not None and "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = type_ids
    out = model(**kwargs)
    cls = torch.stack([h[:, 0] for h in out.hidden_states[1:]], dim=1)  # (B, L, H)
    # repr: [CLS] of the last layer, what `transferset score` stores as teacher_hidden by default.
    return {"logits": out.logits, "repr": cls[:, -1], "cls_layers": cls}   # (B, C), (B, H), (B, L, H)
