"""Training schedules: which losses and which parameter groups, phase by phase.

Pure functions: `phases(...)` turns a schedule name, the configured loss weights and the epoch
budget into a list of Phase records; the trainer runs them in order and never decides on its
own what is trainable. Parameter groups are named bottom-up, as every family names them
(students.family.GROUPS): embeddings → encoder → head → classifier.

- joint: the configured losses, every parameter, one phase.
- progressive (Mukherjee & Awadallah 2019): stage 1 representation loss on the transfer set;
  stage 2 logits loss, unfreezing top-down (classifier + head, then + encoder, then + embeddings),
  each step trained until dev accuracy stops improving; stage 3 CE on gold labels with the same
  top-down unfreezing.
- distill-then-finetune: the distillation losses, then CE on gold labels, every parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from students.family import GROUPS
from students.losses import LossWeights

SCHEDULES = ("joint", "progressive", "distill-then-finetune")


@dataclass(frozen=True)
class Phase:
    stage: int                  # 1-based; phases of one stage share the number
    name: str                   # shown in progress bars, history and curves
    weights: LossWeights
    trainable: tuple[str, ...]  # parameter groups that learn in this phase; the rest are frozen
    epochs: int                 # at most this many epochs
    early_stop: bool            # stop when dev accuracy has not improved for `patience` epochs
    labeled_only: bool = False  # iterate only the rows with a gold label (pure CE phases)


def top_down(groups: Sequence[str] = GROUPS) -> list[tuple[str, ...]]:
    """Unfreezing steps, top first: (head, classifier), (encoder, head, classifier), (all)."""
    groups = tuple(groups)
    if len(groups) < 3:
        raise ValueError(f"top-down unfreezing needs at least 3 parameter groups, got {groups}")
    return [groups[i:] for i in range(len(groups) - 2, -1, -1)]


def _logits_only(w: LossWeights) -> LossWeights:
    # Stage 2 is the "logits loss": KD if that is what the config asks for, else MSE (Tang et al.).
    if w.kd and not w.mse:
        return LossWeights(kd=w.kd, temperature=w.temperature)
    return LossWeights(mse=w.mse or 1.0)


def phases(schedule: str, weights: LossWeights, epochs: int, groups: Sequence[str] = GROUPS) -> list[Phase]:
    """The phases of `schedule` for a model whose parameter groups are `groups` (bottom-up)."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    everything = tuple(groups)
    if schedule == "joint":
        if not weights.active():
            raise ValueError("joint schedule: every loss weight is zero")
        # With gold CE as the only loss, rows without a label add nothing: iterate the labeled ones.
        ce_only = set(weights.active()) == {"ce"}
        return [Phase(1, "joint", weights, everything, epochs, early_stop=True, labeled_only=ce_only)]
    if schedule == "progressive":
        names = ["a", "b", "c", "d", "e"]
        # Stage 1 trains everything the representation depends on; the classifier gets no gradient
        # from it, so it stays frozen rather than drift under weight decay.
        out = [Phase(1, "1 repr", LossWeights(repr=weights.repr or 1.0), everything[:-1], epochs, early_stop=False)]
        for i, step in enumerate(top_down(groups)):
            out.append(Phase(2, f"2{names[i]} logits: {'+'.join(step)}", _logits_only(weights), step, epochs,
                             early_stop=True))
        for i, step in enumerate(top_down(groups)):
            out.append(Phase(3, f"3{names[i]} gold CE: {'+'.join(step)}", LossWeights(ce=weights.ce or 1.0), step,
                             epochs, early_stop=True, labeled_only=True))
        return out
    if schedule == "distill-then-finetune":
        distill = replace(weights, ce=0.0)
        if not distill.active():
            distill = LossWeights(mse=1.0)
        return [
            Phase(1, "1 distill", distill, everything, epochs, early_stop=True),
            Phase(2, "2 gold CE", LossWeights(ce=weights.ce or 1.0), everything, epochs, early_stop=True,
                  labeled_only=True),
        ]
    raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
