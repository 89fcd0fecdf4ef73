"""Distillation losses, each a plain function of tensors, and their weighted sum.

Batches are dicts keyed by the schema's column names; they carry the gold label as -1 where the
row has none (augmented or unlabeled text): the CE term averages over labeled rows only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from students import layer_losses
from transferset import schema

NO_LABEL = -1
# Batch key of the (B, L, H) stack of teacher_hidden_l{k} columns matched to the student's layers.
TEACHER_LAYERS = "teacher_layers"


@dataclass
class LossWeights:
    ce: float = 0.0        # cross-entropy on gold labels (rows whose `label` is set)
    mse: float = 0.0       # MSE on logits (Tang et al. 2019; Ba & Caruana)
    kd: float = 0.0        # KL(softmax(t/T) ‖ softmax(s/T))·T² (Hinton et al. 2015)
    repr: float = 0.0      # MSE of the student's representation head to `teacher_hidden`
    pkd: float = 0.0       # BERT-PKD: normalised [CLS] of intermediate layers
    # Token-level layer losses (students/layer_losses.py), against the teacher run online (students/online.py).
    emb_mse: float = 0.0   # TinyBERT: embedding-layer MSE
    hidden_mse: float = 0.0  # TinyBERT / MobileBERT: per-token hidden MSE of mapped layers
    att_mse: float = 0.0   # TinyBERT: attention scores (before softmax) MSE
    att_kl: float = 0.0    # MobileBERT / MiniLM: KL of attention distributions
    value_kl: float = 0.0  # MiniLM: KL of value relations softmax(V·Vᵀ/√d_k)
    cos: float = 0.0       # DistilBERT: 1 − cos of last hidden states
    temperature: float = 1.0
    # A progressive-knowledge-transfer stage: only the pairs of these student layers count (None: all).
    layers: Optional[Tuple[int, ...]] = None

    def active(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if k not in ("temperature", "layers") and v}

    def layer_active(self) -> dict[str, float]:
        """The active losses that need the teacher's token-level states."""
        return {k: v for k, v in self.active().items() if k in layer_losses.LAYER_LOSSES}

    @classmethod
    def of(cls, cfg) -> "LossWeights":
        """The weights a StudentConfig sets (its fields of the same names)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "layers"})


def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean CE over rows with a gold label; 0 (still differentiable) when none has one."""
    keep = labels != NO_LABEL                                  # (B,)
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], labels[keep])


def logits_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over rows and classes of (s - t)²."""
    return F.mse_loss(student, teacher)


def kd_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t/T) ‖ softmax(s/T)) · T², summed over classes, averaged over rows.

    The T² keeps the gradient scale independent of T (Hinton et al. 2015).
    """
    T = temperature
    log_p_s = F.log_softmax(student / T, dim=-1)
    log_p_t = F.log_softmax(teacher / T, dim=-1)
    return F.kl_div(log_p_s, log_p_t, reduction="batchmean", log_target=True) * (T * T)


def repr_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over rows and dimensions of (h_s - h_t)²."""
    return F.mse_loss(student, teacher.to(student.dtype))


def pkd(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """BERT-PKD patient loss on (B, L, H) stacks of [CLS] states.

    ‖h_s/‖h_s‖ − h_t/‖h_t‖‖² summed over H, averaged over rows and layers (Sun et al. 2019, eq. 4,
    with the sum over layers made a mean so the weight does not grow with the number of layers).
    """
    s = F.normalize(student, dim=-1)
    t = F.normalize(teacher.to(student.dtype), dim=-1)
    return (s - t).pow(2).sum(-1).mean()


def combine(outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor],
            weights: LossWeights) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted sum of the active losses; also each term's value for logging."""
    parts: dict[str, torch.Tensor] = {}
    w = weights.active()
    if "ce" in w:
        parts["ce"] = ce(outputs["logits"], batch[schema.LABEL])
    if "mse" in w:
        parts["mse"] = logits_mse(outputs["logits"], batch[schema.TEACHER_LOGITS])
    if "kd" in w:
        parts["kd"] = kd_kl(outputs["logits"], batch[schema.TEACHER_LOGITS], weights.temperature)
    if "repr" in w:
        parts["repr"] = repr_mse(outputs["repr"], batch[schema.TEACHER_HIDDEN])
    if "pkd" in w:
        parts["pkd"] = pkd(outputs["cls_layers"], batch[TEACHER_LAYERS])
    layer = weights.layer_active()
    if layer:
        if layer_losses.TEACHER_STATES not in batch:
            raise ValueError(f"{sorted(layer)} need the teacher's token-level states: none in the batch "
                             "(students.online.forward adds them)")
        parts.update(layer_losses.terms(outputs[layer_losses.STUDENT_STATES], batch[layer_losses.TEACHER_STATES],
                                        outputs[layer_losses.LAYER_PAIRS], batch["mask"], layer, weights.layers))
    if not parts:
        raise ValueError("no loss has a non-zero weight")
    total: Optional[torch.Tensor] = None
    for name, value in parts.items():
        term = w[name] * value
        total = term if total is None else total + term
    assert total is not None
    return total, {k: float(v.detach()) for k, v in parts.items()}
