"""Small Transformer student (BERT-PKD, Sun et al. 2019).

A post-LayerNorm BERT encoder with k layers, initialised from the teacher: every m-th teacher
layer ("skip", m = teacher layers // k, so the top teacher layer is always kept) or the first k
("first"); or random with its own width ("random"). The [CLS] state of the last layer goes
through Dense + GELU to the teacher's hidden width (the representation head), then a classifier.
The [CLS] state of every layer is returned for the PKD loss.

Parameter names follow Hugging Face BERT's (embeddings.word_embeddings, encoder.layer.N.attention
...) minus the prefix, so a teacher state dict maps onto it by renumbering layers only.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TransformerConfig:
    vocab_size: int = 30522     # the teacher's WordPiece vocabulary
    max_position: int = 512
    type_vocab_size: int = 2
    n_layer: int = 3            # k: half of a 6-layer MiniLM teacher
    n_head: int = 12            # MiniLM: 12 heads of 32
    d_model: int = 384          # must equal the teacher's width unless init == "random"
    d_ff: int = 1536            # 4 × d_model, as in BERT
    dropout: float = 0.1
    ln_eps: float = 1e-12       # BERT's LayerNorm epsilon
    head_dim: int = 384         # representation width = teacher hidden width
    num_classes: int = 2
    init: str = "skip"          # "skip" (PKD), "first" (first k teacher layers) or "random"
    teacher_layers: int = 6     # layers of the teacher it is initialised / distilled from
    pad_id: int = 0


GROUPS = ("embeddings", "encoder", "head", "classifier")
INITS = ("skip", "first", "random")


def config_fields() -> set[str]:
    return {f.name for f in fields(TransformerConfig)}


def teacher_layer_map(n_layer: int, teacher_layers: int, init: str) -> list[int]:
    """Teacher layer (1-based, as in `teacher_hidden_l{k}` / hidden_states[k]) behind each student layer."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if n_layer > teacher_layers:
        raise ValueError(f"a {n_layer}-layer student cannot take layers from a {teacher_layers}-layer teacher")
    if init == "first":
        return list(range(1, n_layer + 1))
    # "skip", and also the PKD targets of a randomly initialised student.
    m = teacher_layers // n_layer
    return [m * (j + 1) for j in range(n_layer)]


class SelfAttention(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.n_head = c.n_head
        self.query = nn.Linear(c.d_model, c.d_model)
        self.key = nn.Linear(c.d_model, c.d_model)
        self.value = nn.Linear(c.d_model, c.d_model)
        self.dropout = c.dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        def split(t):  # (B, T, D) → (B, nh, T, hd)
            return t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        attn_mask = mask[:, None, None, :]                                # (B, 1, 1, T) True = attend
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, D)                         # (B, T, D)


class Layer(nn.Module):
    """One BERT layer: post-LN attention block and feed-forward block."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.attention = SelfAttention(c)
        self.attention_output = nn.Linear(c.d_model, c.d_model)
        self.attention_norm = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.intermediate = nn.Linear(c.d_model, c.d_ff)
        self.output = nn.Linear(c.d_ff, c.d_model)
        self.output_norm = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.drop(self.attention_output(self.attention(x, mask))))  # (B, T, D)
        return self.output_norm(x + self.drop(self.output(F.gelu(self.intermediate(x)))))       # (B, T, D)


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        if c.d_model % c.n_head:
            raise ValueError(f"d_model {c.d_model} is not divisible by n_head {c.n_head}")
        self.config = c
        self.word_embeddings = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.position_embeddings = nn.Embedding(c.max_position, c.d_model)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.d_model)
        self.embeddings_norm = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        self.head = nn.Linear(c.d_model, c.head_dim)
        self.classifier = nn.Linear(c.head_dim, c.num_classes)
        self.drop = nn.Dropout(c.dropout)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # BERT's initialiser: N(0, 0.02), zero biases.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        emb = [self.word_embeddings, self.position_embeddings, self.token_type_embeddings, self.embeddings_norm]
        return {
            "embeddings": [p for m in emb for p in m.parameters()],
            "encoder": list(self.layers.parameters()),
            "head": list(self.head.parameters()),
            "classifier": list(self.classifier.parameters()),
        }

    def forward(self, ids: torch.Tensor, mask: torch.Tensor,
                type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        types = torch.zeros_like(ids) if type_ids is None else type_ids
        x = self.word_embeddings(ids) + self.position_embeddings(pos)[None] + self.token_type_embeddings(types)
        x = self.drop(self.embeddings_norm(x))                          # (B, T, D)
        cls = []
        for layer in self.layers:
            x = layer(x, mask)                                          # (B, T, D)
            cls.append(x[:, 0])                                         # (B, D)
        rep = F.gelu(self.head(self.drop(x[:, 0])))                     # (B, H)
        logits = self.classifier(self.drop(rep))                        # (B, C)
        return {"logits": logits, "repr": rep, "cls_layers": torch.stack(cls, dim=1)}  # (B, k, D)

    def load_teacher(self, state: Mapping[str, torch.Tensor], layers: Sequence[int]) -> None:
        """Copy the teacher's embeddings and its 1-based `layers` (one per student layer).

        `state` is a Hugging Face BERT state dict, with or without the `bert.` prefix.
        """
        if len(layers) != len(self.layers):
            raise ValueError(f"{len(layers)} teacher layers given for {len(self.layers)} student layers")
        prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
        names = {
            "word_embeddings.weight": "embeddings.word_embeddings.weight",
            "position_embeddings.weight": "embeddings.position_embeddings.weight",
            "token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
            "embeddings_norm.weight": "embeddings.LayerNorm.weight",
            "embeddings_norm.bias": "embeddings.LayerNorm.bias",
        }
        per_layer = {
            "attention.query": "attention.self.query",
            "attention.key": "attention.self.key",
            "attention.value": "attention.self.value",
            "attention_output": "attention.output.dense",
            "attention_norm": "attention.output.LayerNorm",
            "intermediate": "intermediate.dense",
            "output": "output.dense",
            "output_norm": "output.LayerNorm",
        }
        for j, k in enumerate(layers):
            for ours, theirs in per_layer.items():
                for p in ("weight", "bias"):
                    names[f"layers.{j}.{ours}.{p}"] = f"encoder.layer.{k - 1}.{theirs}.{p}"
        own = self.state_dict()
        missing = [prefix + t for t in names.values() if prefix + t not in state]
        if missing:
            raise ValueError(f"teacher weights lack {missing[:3]}{' ...' if len(missing) > 3 else ''}; "
                             "is the teacher a BERT-style encoder?")
        with torch.no_grad():
            for ours, theirs in names.items():
                src = state[prefix + theirs]
                if src.shape != own[ours].shape:
                    raise ValueError(f"teacher {theirs} has shape {tuple(src.shape)}, the student's {ours} "
                                     f"{tuple(own[ours].shape)}: set d_model/d_ff/n_head to the teacher's")
                own[ours].copy_(src)
