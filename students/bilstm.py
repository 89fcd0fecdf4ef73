"""BiLSTM student (Mukherjee & Awadallah 2019, XtremeDistil; `tang` preset: Tang et al. 2019).

embeddings → BiLSTM returning sequences → max-pool over time → Dense + GELU to the teacher's
hidden width (the representation head, trained against `teacher_hidden`) → classifier.

The `tang` preset is the Distilled BiLSTM: 300-d embeddings, one layer of 150 units per
direction, the concatenated last states (no max-pool), FC 200 + ReLU, classifier.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BiLSTMConfig:
    vocab_size: int = 30522   # the teacher's WordPiece vocabulary (MiniLM / BERT uncased)
    embed_dim: int = 300      # Tang et al. and XtremeDistil both use 300-d word vectors
    hidden: int = 300         # LSTM units per direction (XtremeDistil: 600 in total)
    layers: int = 1
    pool: str = "max"         # "max": max over time (XtremeDistil); "last": final states (Tang)
    head_dim: int = 384       # representation width = teacher hidden width, so repr MSE applies
    head_act: str = "gelu"    # "gelu" (XtremeDistil) or "relu" (Tang)
    num_classes: int = 2
    dropout: float = 0.1
    pad_id: int = 0


PRESETS = {
    # Tang et al. 2019: 300-d, 1 BiLSTM layer of 150 per direction, FC 200 + ReLU.
    "tang": dict(embed_dim=300, hidden=150, layers=1, pool="last", head_dim=200, head_act="relu"),
    # Mukherjee & Awadallah 2019: BiLSTM(600) returning sequences, max-pool, Dense+GELU(teacher width).
    "xtremedistil": dict(embed_dim=300, hidden=300, layers=1, pool="max", head_act="gelu"),
}

# Parameter groups, bottom-up: progressive unfreezing thaws them top-down.
GROUPS = ("embeddings", "encoder", "head", "classifier")


def config_fields() -> set[str]:
    return {f.name for f in fields(BiLSTMConfig)}


class BiLSTM(nn.Module):
    def __init__(self, config: BiLSTMConfig):
        super().__init__()
        if config.pool not in ("max", "last"):
            raise ValueError(f"pool must be 'max' or 'last', got {config.pool!r}")
        if config.head_act not in ("gelu", "relu"):
            raise ValueError(f"head_act must be 'gelu' or 'relu', got {config.head_act!r}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
        self.lstm = nn.LSTM(config.embed_dim, config.hidden, num_layers=config.layers, batch_first=True,
                            bidirectional=True, dropout=config.dropout if config.layers > 1 else 0.0)
        self.head = nn.Linear(2 * config.hidden, config.head_dim)
        self.classifier = nn.Linear(config.head_dim, config.num_classes)
        self.drop = nn.Dropout(config.dropout)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "embeddings": list(self.embed.parameters()),
            "encoder": list(self.lstm.parameters()),
            "head": list(self.head.parameters()),
            "classifier": list(self.classifier.parameters()),
        }

    def _direction(self, x: torch.Tensor, layer: int, reverse: bool) -> torch.Tensor:
        """One direction of one layer of `self.lstm` over padded rows: (B, T, D) → (B, T, H)."""
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        weights = [getattr(self.lstm, f"{name}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        h0 = x.new_zeros(1, x.shape[0], self.config.hidden)
        # nn.LSTM's own kernel (what its forward calls), one direction at a time.
        out, _, _ = torch._VF.lstm(x, (h0, h0), weights, True, 1, 0.0, self.training, False, True)
        return out

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bidirectional LSTM over right-padded rows → (outputs (B, T, 2H), last states (B, 2H)).

        A row must not depend on what else is in its batch (save → load → identical predictions),
        so padding must never reach a real position. The forward direction runs over the padded
        rows as they are (padding comes after every real token); the backward direction runs over
        each row reversed within its own length, so it too starts at the row's last real token.
        Both run on padded tensors: ~1.5× faster on a CPU than a packed sequence, same values.
        """
        B, T, _ = x.shape
        t = torch.arange(T, device=x.device).unsqueeze(0)                           # (1, T)
        # Reverses positions 0..L-1 of each row, leaves the padding in place; its own inverse.
        rev = torch.where(t < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - t, t)  # (B, T)
        last = (lengths - 1).view(B, 1, 1)
        for layer in range(self.config.layers):
            if layer:
                x = F.dropout(x, self.config.dropout, self.training)
            fwd = self._direction(x, layer, reverse=False)                             # (B, T, H)
            bwd_rev = self._direction(x.gather(1, rev.unsqueeze(-1).expand_as(x)), layer, reverse=True)
            bwd = bwd_rev.gather(1, rev.unsqueeze(-1).expand_as(bwd_rev))              # (B, T, H)
            x = torch.cat([fwd, bwd], dim=-1)                                          # (B, T, 2H)
        H = self.config.hidden
        last_fwd = fwd.gather(1, last.expand(B, 1, H)).squeeze(1)                      # (B, H)
        last_bwd = bwd_rev.gather(1, last.expand(B, 1, H)).squeeze(1)                  # (B, H) = position 0
        return x, torch.cat([last_fwd, last_bwd], dim=-1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        lengths = mask.sum(1).clamp(min=1)                              # (B,)
        x = self.drop(self.embed(ids))                                  # (B, T, E)
        out, last = self.encode(x, lengths)                             # (B, T, 2H), (B, 2H)
        if self.config.pool == "max":
            valid = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)
            pooled = out.masked_fill(~valid.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H)
        else:
            pooled = last                                               # (B, 2H) last layer, both directions
        z = self.head(self.drop(pooled))                                # (B, D)
        rep = F.gelu(z) if self.config.head_act == "gelu" else F.relu(z)
        logits = self.classifier(self.drop(rep))                        # (B, C)
        return {"logits": logits, "repr": rep}

    def init_embeddings(self, weight: torch.Tensor) -> None:
        """Copy precomputed vectors (e.g. the teacher's, projected by PCA) into the embedding table."""
        if weight.shape != self.embed.weight.shape:
            raise ValueError(f"embedding init has shape {tuple(weight.shape)}, "
                             f"the model needs {tuple(self.embed.weight.shape)}")
        with torch.no_grad():
            self.embed.weight.copy_(weight)
            self.embed.weight[self.config.pad_id].zero_()
