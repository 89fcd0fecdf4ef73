"""Static student (`student: static`): token vectors → mean and max pooling over the real tokens → a small MLP →
classifier.

No recurrence and no attention: a row costs one embedding lookup per token, two reductions over time and
a few small matrix products, so it is the fastest point of the speed frontier (a bag of vectors, as in
Joulin et al. 2017's fastText classifier and Shen et al. 2018's SWEM, whose mean+max pooling this is).
Its vectors are the BiLSTM's: the same tokens and the same `embed_init` table (students/families/bilstm.py
`initial_vectors`), frozen unless they are random (StudentConfig.freeze_embeddings).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from students.families import Batch, Built, Context, Family, model_values, projection, register
from students.families.bilstm import (BILSTM_ENGINE, check_sparse, copy_vectors, initial_vectors, load_student, save,
                                     student_tokens)
from transferset.config import StudentConfig
from transferset.runtime.errors import UserError

POOLINGS = ("mean", "max", "mean+max")
# What max-pooling adds to a padding position: below any vector's value, and it absorbs the value (x - 1e30 is
# -1e30 in float32 for |x| < 1e22), so a padded row's max is that of its real positions exactly.
_FAR = 1e30
ACTIVATIONS = ("gelu", "relu")


@dataclass
class StaticConfig:
    vocab_size: int = 30522     # the teacher's WordPiece vocabulary (MiniLM / BERT uncased)
    embed_dim: int = 300        # the BiLSTM's width: the same PCA'd teacher table fits both
    pooling: str = "mean+max"   # "mean", "max", or both concatenated (SWEM-concat: 2 × embed_dim features)
    hidden: int = 256           # width of the MLP's layers; the repr width
    layers: int = 1             # hidden layers of the MLP (Linear + activation + dropout each)
    act: str = "gelu"           # "gelu" or "relu"
    num_classes: int = 2
    dropout: float = 0.1        # on the pooled features and after each hidden layer
    word_dropout: float = 0.0   # in training, each real token left out of the pooling with this chance (DAN's)
    pad_id: int = 0
    sparse: bool = False        # the table's gradients sparse, learnt by lazy Adam (bilstm.check_sparse)


def config_fields() -> set[str]:
    return {f.name for f in fields(StaticConfig)}


class Static(nn.Module):
    def __init__(self, config: StaticConfig):
        super().__init__()
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {config.pooling!r}")
        if config.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {config.act!r}")
        if not 0 <= config.word_dropout < 1:
            raise ValueError(f"word_dropout must be in [0, 1), got {config.word_dropout}")
        if config.layers < 1 or config.hidden < 1:
            raise ValueError(f"layers and hidden must be at least 1, got layers={config.layers}, "
                             f"hidden={config.hidden}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id,
                                  sparse=config.sparse)
        pooled = config.embed_dim * (2 if config.pooling == "mean+max" else 1)
        widths = [pooled] + [config.hidden] * config.layers
        self.head = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.classifier = nn.Linear(config.hidden, config.num_classes)
        self.drop = nn.Dropout(config.dropout)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """students.families.GROUPS but "encoder" (there is none): top-down unfreezing thaws head, then
        embeddings."""
        return {"embeddings": list(self.embed.parameters()), "head": list(self.head.parameters()),
                "classifier": list(self.classifier.parameters())}

    def pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean and/or max over the positions `mask` (0/1) marks, whatever the padding holds: (B, T, E) → (B, P).

        Written in the few elementwise ops the exported graph runs as they are (at batch 1 the graph's time is
        mostly per-node overhead): a real position's vector is added 0 or multiplied by 1, exactly itself. A
        row without a real token pools to zeros (the tokenizers always give [CLS] and [SEP], so only a
        hand-made batch has one)."""
        w = mask.unsqueeze(-1).to(x.dtype)                                    # (B, T, 1): 1 real, 0 padding
        parts = []
        if self.config.pooling in ("mean", "mean+max"):
            parts.append((x * w).sum(1) / w.sum(1).clamp(min=1))              # (B, E)
        if self.config.pooling in ("max", "mean+max"):
            top = (x + (w - 1) * _FAR).max(dim=1).values                      # (B, E): padding at -1e30
            parts.append(top * w.amax(1))                                     # an empty row: 0, not -1e30
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]      # (B, P)

    def drop_words(self, mask: torch.Tensor) -> torch.Tensor:
        """Iyyer et al. 2015's word dropout (DAN): each real position of `mask` kept with chance 1 - word_dropout; a
        row that would keep none keeps all of its own."""
        real = mask.bool()
        kept = real & (torch.rand(mask.shape, device=mask.device) >= self.config.word_dropout)  # (B, T)
        kept = torch.where(kept.any(1, keepdim=True), kept, real)
        return kept.to(mask.dtype)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training and self.config.word_dropout > 0:
            mask = self.drop_words(mask)
        x = self.embed(ids)                                                   # (B, T, E)
        h = self.drop(self.pool(x, mask))                                     # (B, P)
        act = F.gelu if self.config.act == "gelu" else F.relu
        for layer in self.head:
            rep = act(layer(h))                                               # (B, H)
            h = self.drop(rep)
        logits = self.classifier(h)                                           # (B, C)
        return {"logits": logits, "repr": rep}

    def init_embeddings(self, weight: torch.Tensor) -> None:
        """Copy precomputed vectors (`embed_init`'s table) into the embedding table; the pad row stays zero."""
        copy_vectors(self.embed, weight, self.config.pad_id)


class StaticGraph(nn.Module):
    """The exported forward pass (students/compress/export.py): the tokenizer's ids (a trimmed vocabulary's
    remapping inside the graph) and attention mask → logits, dropout off."""

    def __init__(self, model: Static, remap: Optional[torch.Tensor]):
        super().__init__()
        self.model = model
        self.register_buffer("remap", remap.clone() if remap is not None else None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ids = self.remap[input_ids] if self.remap is not None else input_ids  # (B, T)
        return self.model(ids, attention_mask)["logits"]                      # (B, C)


# --------------------------------------------------------------------------- the family: build, save, load


def build(ctx: Context) -> Built:
    """The static student on the BiLSTM's tokens, its vectors the BiLSTM's `embed_init` table."""
    cfg = ctx.cfg
    if cfg.preset:
        raise UserError(f"the static student has no presets; drop `preset: {cfg.preset}` (set its shape under "
                        "`model:`, e.g. {hidden: 256, pooling: mean+max})")
    tokens, wordpiece = student_tokens(ctx)
    fixed = {"vocab_size": tokens.vocab_size, "num_classes": len(ctx.label_names), "pad_id": tokens.pad_id}
    model = shaped(cfg, fixed, ctx.hidden_width)
    config = model.config
    if cfg.vocab.embed_init != "random":
        model.init_embeddings(initial_vectors(ctx, tokens, wordpiece, config.embed_dim))
    # repr (and the progressive phase plan's stage 1) compare the MLP's output with teacher_hidden: through
    # a projection when the widths differ, as a narrow transformer's do.
    compares = bool(cfg.weight("repr") or cfg.phases == "progressive")
    proj = projection(config.hidden, ctx.hidden_width) if compares else None
    return Built(model, tokens, config, config.hidden, [], proj)


def shaped(cfg: StudentConfig, fixed: dict, hidden_width: int) -> Static:
    """The static student of these settings, untrained (Family.shaped): `model:` < `fixed`."""
    try:
        model = Static(StaticConfig(**model_values({}, cfg.model, config_fields(), "static", fixed)))
    except (TypeError, ValueError) as exc:
        raise UserError(f"static student: {exc}") from exc
    check_sparse(model.config.sparse, cfg)
    return model


def forward_batch(model: Static, batch: Batch) -> dict[str, torch.Tensor]:
    return model(batch["ids"], batch["mask"])


def load(model_dir: str, sidecar: dict):
    """→ (model, tokens, config) of a directory written by `save` (the BiLSTM's files: weights, tokens)."""
    return load_student(model_dir, sidecar, StaticConfig, Static, "static")


def export_graph(model: Static, tokens) -> nn.Module:
    return StaticGraph(model, tokens.remap)


# The BiLSTM's engine, as the nearest family (same tokens, vectors and learning rate); not measured apart.
FAMILY = register(Family("static", build=build, forward=forward_batch, param_groups=Static.param_groups, save=save,
                         load=load, default_lr=2e-3, export_graph=export_graph, engine=BILSTM_ENGINE,
                         teacher_vectors=True, shaped=shaped))
