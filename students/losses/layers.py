"""Layer-wise distillation losses on token-level states: plain functions of tensors.

The formulas follow the papers and TextBrewer's `losses.py` (airaria/TextBrewer), with padding masked:
`mask` is the batch's (B, L) attention mask, True on real tokens. Hidden states are (B, L, H) and must
already share a width (the student's go through a learned projection W_h first, students/losses/online.py);
attention scores are (B, heads, L, L) before the softmax, Q·Kᵀ/√d_k without the padding bias; value
states are (B, heads, L, d_k), and d_k may differ between student and teacher (the relation is L × L).
Attention and value-relation losses compare head by head: student and teacher need as many heads.

Everything is computed in float32 (a half-precision bias of -1e9 would be -inf, and 0·(-inf) is NaN).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

# Added to the scores of padded keys before a softmax: their probability underflows to exactly 0 while
# log-probabilities stay finite (no 0·∞ in the KL).
NEG = -1e9


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.float32)


def hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT's hidden / embedding loss and MobileBERT's feature-map transfer, per token:
    Σ over real tokens and dimensions of (h_s − h_t)² / (real tokens · H) (TextBrewer `hid_mse_loss`)."""
    m = _valid(mask).unsqueeze(-1)                                          # (B, L, 1)
    diff = (student.float() - teacher.float()).pow(2) * m
    return diff.sum() / (m.sum() * student.size(-1)).clamp_min(1.0)


def _pair_mask(mask: torch.Tensor) -> torch.Tensor:
    m = _valid(mask)
    return (m.unsqueeze(-1) * m.unsqueeze(-2)).unsqueeze(1)                   # (B, 1, L, L): query i and key j real


def _check_heads(student: torch.Tensor, teacher: torch.Tensor, what: str) -> None:
    if student.shape[:2] != teacher.shape[:2] or student.size(2) != teacher.size(2):
        raise ValueError(f"{what}: student {tuple(student.shape)} and teacher {tuple(teacher.shape)} differ in "
                         "batch, heads or length; the losses compare head by head")


def attention_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT's attention loss: MSE of the scores before softmax over (head, query, key) with both query
    and key real, i.e. Σ (a_s − a_t)² / Σ_b heads·len_b² (TextBrewer `att_mse_loss` with a mask)."""
    _check_heads(student, teacher, "attention MSE")
    pm = _pair_mask(mask)
    diff = (student.float() - teacher.float()).pow(2) * pm
    return diff.sum() / (pm.sum() * student.size(1)).clamp_min(1.0)


def _log_dist(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax over keys, padded keys removed."""
    keys = mask.to(torch.bool)[:, None, None, :]                              # (B, 1, 1, L)
    return F.log_softmax(scores.float().masked_fill(~keys, NEG), dim=-1)


def dist_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(student)) of each row of (B, heads, L, L) scores, summed over the real
    keys, averaged over heads and real query positions (MobileBERT's attention transfer; MiniLM's attention
    and value-relation losses)."""
    _check_heads(student, teacher, "attention KL")
    log_s, log_t = _log_dist(student, mask), _log_dist(teacher, mask)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)                              # (B, heads, L)
    q = _valid(mask).unsqueeze(1)                                             # (B, 1, L)
    return (kl * q).sum() / (q.sum() * student.size(1)).clamp_min(1.0)


def value_relation(values: torch.Tensor) -> torch.Tensor:
    """MiniLM's value relation scores V·Vᵀ/√d_k per head (the softmax is taken in `dist_kl`): (B, h, L, L)."""
    v = values.float()
    return v @ v.transpose(-1, -2) / math.sqrt(v.size(-1))


def value_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MiniLM's value-relation transfer: KL between softmax(V·Vᵀ/√d_k) of teacher and student, per head.
    The relation is L × L, so the heads' widths d_k may differ."""
    return dist_kl(value_relation(student), value_relation(teacher), mask)


def cosine(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DistilBERT's cosine loss: mean over real tokens of 1 − cos(h_s, h_t) (TextBrewer `cos_loss`)."""
    cos = F.cosine_similarity(student.float(), teacher.float(), dim=-1)       # (B, L)
    m = _valid(mask)
    return ((1.0 - cos) * m).sum() / m.sum().clamp_min(1.0)


# --------------------------------------------------------------------------- a model's states, and the terms


# Batch / outputs keys: the online teacher's states (added to the batch) and the student's (in its outputs),
# and the (student layer, teacher layer) pairs the layer map gives (in the student's outputs).
TEACHER_STATES = "teacher_states"
STUDENT_STATES = "student_states"
LAYER_PAIRS = "layer_pairs"
# What a layer loss reads of the student's and the teacher's token-level states: the embeddings (layer 0), the last
# layer, each mapped layer pair's hidden states, or each mapped pair's attention (its q, k, v, captured on the way).
EMBEDDINGS, LAST, HIDDEN, ATTENTION = READS = ("embeddings", "last", "hidden", "attention")
PAIRED = (HIDDEN, ATTENTION)  # computed on each mapped (student, teacher) layer pair and averaged

class States:
    """A transformer's token-level states of one batch.

    hidden[k]: (B, L, H) output of layer k (0: the embeddings), as `hidden_states` of a Hugging Face model;
    qkv[k]: layer k's query, key and value projections split into heads, each (B, heads, L, d_k), captured
    on the way (students.families.transformer_layers.capture_attention). Scores are computed only when a loss asks.
    """

    def __init__(self, hidden, qkv: dict):
        self.hidden = hidden
        self.qkv = qkv

    def scores(self, k: int) -> torch.Tensor:
        """Layer k's attention scores before the softmax, Q·Kᵀ/√d_k (no padding bias): (B, heads, L, L)."""
        q, key, _ = self.qkv[k]
        return q @ key.transpose(-1, -2) / math.sqrt(q.size(-1))

    def values(self, k: int) -> torch.Tensor:
        return self.qkv[k][2]


@dataclass(frozen=True)
class LayerTerm:
    """One layer loss: what it reads (READS) and its term on one (student layer, teacher layer) pair, unweighted;
    a loss that reads the embeddings or the last layer gets (0, 0) or (-1, -1)."""

    reads: str
    fn: Callable[[States, States, int, int, torch.Tensor], torch.Tensor]  # (student, teacher, s, t, mask)

    @property
    def per_pair(self) -> bool:
        return self.reads in PAIRED


# The layer losses, in the order their terms are added (students.losses registers them in it; a package adds its
# own with students.losses.register_layer): the one table of what each reads.
LAYER_TERMS: dict[str, LayerTerm] = {
    "hidden_mse": LayerTerm(HIDDEN, lambda st, te, s, t, mask: hidden_mse(st.hidden[s], te.hidden[t], mask)),
    "att_mse": LayerTerm(ATTENTION, lambda st, te, s, t, mask: attention_mse(st.scores(s), te.scores(t), mask)),
    "att_kl": LayerTerm(ATTENTION, lambda st, te, s, t, mask: dist_kl(st.scores(s), te.scores(t), mask)),
    "value_kl": LayerTerm(ATTENTION, lambda st, te, s, t, mask: value_kl(st.values(s), te.values(t), mask)),
    "emb_mse": LayerTerm(EMBEDDINGS, lambda st, te, s, t, mask: hidden_mse(st.hidden[0], te.hidden[0], mask)),
    "cos": LayerTerm(LAST, lambda st, te, s, t, mask: cosine(st.hidden[-1], te.hidden[-1], mask)),
}


def reading(what: str, names) -> list[str]:
    """The layer losses among `names` that read `what` (READS), in the table's order."""
    return [name for name, t in LAYER_TERMS.items() if name in names and t.reads == what]


def term(name: str, student: States, teacher: States, pairs, mask: torch.Tensor, only=None) -> torch.Tensor:
    """One layer loss (a name of LAYER_TERMS) of one batch, unweighted.

    `pairs`: (student layer, teacher layer), 1-based, from the layer map; per-layer losses are averaged over
    them (TinyBERT sums: its weights are ours × the number of pairs). `only`: the student layers whose pairs
    count (a progressive-knowledge-transfer stage), None for all. cos compares the last layers, emb_mse the
    embeddings, whatever the map.
    """
    layer = LAYER_TERMS[name]
    if not layer.per_pair:
        ends = (0, 0) if layer.reads == EMBEDDINGS else (-1, -1)
        return layer.fn(student, teacher, *ends, mask)
    pairs = [(s, t) for s, t in pairs if only is None or s in only]
    if not pairs:
        raise ValueError(f"{name}: no student layer is mapped to a teacher layer"
                         + (f" among layers {sorted(only)}" if only is not None else ""))
    return torch.stack([layer.fn(student, teacher, s, t, mask) for s, t in pairs]).mean()


def terms(student: States, teacher: States, pairs, mask: torch.Tensor, active: dict,
          only=None) -> dict[str, torch.Tensor]:
    """The active layer losses (names of LAYER_TERMS → weight) of one batch, unweighted (`term` of each)."""
    return {name: term(name, student, teacher, pairs, mask, only) for name in LAYER_TERMS if name in active}
