"""Phase plans (`phases:`): which losses and which parameter groups train, phase by phase.

Pure functions: `phases(...)` turns a phase plan's name, the configured loss weights and the epoch
budget into a list of Phase records; the trainer runs them in order and never decides on its
own what is trainable. Parameter groups are named bottom-up, as every family names them
(students.families.GROUPS): embeddings → encoder → head → classifier.

- joint: the configured losses, every parameter, one phase.
- progressive (Mukherjee & Awadallah 2019): stage 1 representation loss on the transfer set;
  stage 2 logits loss, unfreezing top-down (classifier + head, then + encoder, then + embeddings),
  each step trained until dev accuracy stops improving; stage 3 CE on gold labels with the same
  top-down unfreezing.
- distill-then-finetune: the distillation losses, then CE on gold labels, every parameter.
- two-step (TinyBERT's task distillation, Jiao et al. 2020): the intermediate layers first (the layer
  losses, and repr / pkd; embeddings and encoder learn), then the prediction layer (ce / mse / kd, every
  parameter, early stopping).
- pkt (MobileBERT's progressive knowledge transfer, Sun et al. 2020): one stage per encoder layer, bottom-up,
  in which only that layer learns, on its own pairs' per-layer losses (the layers below stay frozen; an
  emb_mse weight adds a first stage for the embeddings, cos joins the last layer's stage); then prediction
  distillation with every parameter.

A family may split a group per layer ("encoder.1", "encoder.2", ...: the transformer does, for pkt); the
other phase plans treat those as one "encoder" group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from students.families import GROUPS
from students import losses
from students.losses import GOLD, PREDICTION, LossWeights
from transferset.runtime.registry import Registry


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


def coarse(groups: Sequence[str]) -> tuple[str, ...]:
    """The groups with per-layer parts ("encoder.1", "encoder.2") folded into one ("encoder"), in order."""
    return tuple(dict.fromkeys(g.split(".")[0] for g in groups))


def expand(chosen: Sequence[str], groups: Sequence[str]) -> tuple[str, ...]:
    """The family's groups (per-layer parts included) that belong to the `chosen` coarse groups."""
    return tuple(g for g in groups if g.split(".")[0] in chosen)


def _prediction(w: LossWeights) -> LossWeights:
    # The prediction layer's losses as configured; KD alone when the config sets none (TinyBERT's soft CE).
    kept = {k: getattr(w, k) for k in losses.of_role(GOLD, PREDICTION) if getattr(w, k)}
    return LossWeights(**(kept or {"kd": 1.0}), temperature=w.temperature)


def _logits_only(w: LossWeights) -> LossWeights:
    # Stage 2 is the "logits loss": KD if that is what the config asks for, else MSE (Tang et al.).
    if w.kd and not w.mse:
        return LossWeights(kd=w.kd, temperature=w.temperature)
    return LossWeights(mse=w.mse or 1.0)


# A phase plan: (the configured loss weights, epochs, layer_epochs, the parameter groups bottom-up, a family's
# per-layer groups as one "encoder") -> its phases. The five below, and any a package registers: its module calls
# `register` and is named under the entry point group transferset.phase_plans.
PhasePlan = Callable[[LossWeights, int, int, tuple[str, ...]], list[Phase]]
PLANS: Registry[PhasePlan] = Registry("phase plan", "transferset.phase_plans")


def register(name: str) -> Callable[[PhasePlan], PhasePlan]:
    """Register a phase plan under `name` (what `phases:` names)."""
    return lambda plan: PLANS.add(name, plan, by=plan.__module__)


def phases(plan: str, weights: LossWeights, epochs: int, groups: Sequence[str] = GROUPS,
           layer_epochs: Optional[int] = None) -> list[Phase]:
    """The phases of the phase plan `plan` for a model whose parameter groups are `groups` (bottom-up).

    `layer_epochs`: the epochs of each layer-loss phase of two-step and pkt (TinyBERT trains its
    intermediate step far longer than its prediction step); None: `epochs`.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if layer_epochs is not None and layer_epochs < 1:
        raise ValueError(f"layer_epochs must be at least 1, got {layer_epochs}")
    layer_epochs = epochs if layer_epochs is None else layer_epochs
    if plan not in PLANS:
        raise ValueError(f"unknown phase plan {plan!r}; known: {', '.join(PLANS.names())}")
    return PLANS.get(plan)(weights, epochs, layer_epochs, tuple(groups))


# The phase plans this package ships: (weights, epochs, layer_epochs, fine groups bottom-up) -> phases.
@register("joint")
def _joint(weights: LossWeights, epochs: int, layer_epochs: int, fine: tuple[str, ...]) -> list[Phase]:
    if not weights.active():
        raise ValueError("joint phase plan: every loss weight is zero")
    # With gold CE as the only loss, rows without a label add nothing: iterate the labeled ones.
    ce_only = set(weights.active()) == {"ce"}
    return [Phase(1, "joint", weights, fine, epochs, early_stop=True, labeled_only=ce_only)]


@register("progressive")
def _progressive(weights: LossWeights, epochs: int, layer_epochs: int, fine: tuple[str, ...]) -> list[Phase]:
    names = ["a", "b", "c", "d", "e"]
    groups = coarse(fine)
    # Stage 1 trains everything the representation depends on; the classifier gets no gradient
    # from it, so it stays frozen rather than drift under weight decay.
    out = [Phase(1, "1 repr", LossWeights(repr=weights.repr or 1.0), expand(groups[:-1], fine), epochs,
                 early_stop=False)]
    for i, step in enumerate(top_down(groups)):
        out.append(Phase(2, f"2{names[i]} logits: {'+'.join(step)}", _logits_only(weights), expand(step, fine),
                         epochs, early_stop=True))
    for i, step in enumerate(top_down(groups)):
        out.append(Phase(3, f"3{names[i]} gold CE: {'+'.join(step)}", LossWeights(ce=weights.ce or 1.0),
                         expand(step, fine), epochs, early_stop=True, labeled_only=True))
    return out


@register("distill-then-finetune")
def _distill_then_finetune(weights: LossWeights, epochs: int, layer_epochs: int, fine: tuple[str, ...]
                           ) -> list[Phase]:
    distill = weights.replace(ce=0.0)
    if not distill.active():
        distill = LossWeights(mse=1.0)
    return [
        Phase(1, "1 distill", distill, fine, epochs, early_stop=True),
        Phase(2, "2 gold CE", LossWeights(ce=weights.ce or 1.0), fine, epochs, early_stop=True,
              labeled_only=True),
    ]


@register("two-step")
def _two_step(weights: LossWeights, epochs: int, layer_epochs: int, fine: tuple[str, ...]) -> list[Phase]:
    kept = {k: v for k, v in weights.active().items() if k not in losses.of_role(GOLD, PREDICTION)}
    if not kept:
        raise ValueError("two-step phase plan: its first step trains the intermediate layers on the layer losses "
                         "(emb_mse, hidden_mse, att_mse, att_kl, value_kl, cos) or repr / pkd; set one of them")
    # The pooler and classifier get no gradient from the layer losses: frozen, not drifting under weight decay.
    return [Phase(1, "1 intermediate layers", LossWeights(**kept), expand(("embeddings", "encoder"), fine),
                  layer_epochs, early_stop=False),
            Phase(2, "2 prediction layer", _prediction(weights), fine, epochs, early_stop=True)]


@register("pkt")
def _pkt(weights: LossWeights, epochs: int, layer_epochs: int, fine: tuple[str, ...]) -> list[Phase]:
    per_layer = {k: getattr(weights, k) for k in losses.per_pair() if getattr(weights, k)}
    if not per_layer:
        raise ValueError("pkt phase plan: each stage trains one layer on its per-layer losses; set hidden_mse, "
                         "att_mse, att_kl or value_kl")
    layers = [g for g in fine if g.startswith("encoder.")]
    if not layers:
        raise ValueError("pkt phase plan: it trains one encoder layer at a time, and this student has no "
                         "per-layer parameter groups (a transformer student has)")
    out = []
    if weights.emb_mse:
        out.append(Phase(1, "1 pkt embeddings", LossWeights(emb_mse=weights.emb_mse), ("embeddings",), layer_epochs,
                         early_stop=False))
    for i, group in enumerate(layers, start=1):
        extra = {"cos": weights.cos} if weights.cos and i == len(layers) else {}
        out.append(Phase(1, f"1 pkt layer {i}", LossWeights(**per_layer, **extra, layers=(i,)), (group,), layer_epochs,
                         early_stop=False))
    out.append(Phase(2, "2 prediction", _prediction(weights), fine, epochs, early_stop=True))
    return out
