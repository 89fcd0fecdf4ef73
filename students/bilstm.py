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
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


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

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        B, T = ids.shape
        lengths = mask.sum(1).clamp(min=1)                              # (B,)
        x = self.drop(self.embed(ids))                                  # (B, T, E)
        # Packing keeps padding out of the backward direction: a row's prediction must not
        # depend on what else is in its batch (save → load → identical predictions).
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h, _) = self.lstm(packed)
        if self.config.pool == "max":
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)  # (B, T, 2H)
            out = out.masked_fill(~mask.unsqueeze(-1), float("-inf"))
            pooled = out.max(dim=1).values                              # (B, 2H)
        else:
            pooled = torch.cat([h[-2], h[-1]], dim=-1)                  # (B, 2H) last layer, both directions
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
