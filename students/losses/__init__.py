"""Distillation losses, registered by name as augmenters are, and their weighted sum.

A loss is one registration: its name (its key under a student's `losses:`), the batch and output keys it reads
(cached columns such as teacher_logits / teacher_hidden, or ONLINE: the teacher's token-level states, which
students/losses/online.py adds when such a loss is on), an optional frozen dataclass of its own settings, and a
function of (outputs, batch, weights) giving its unweighted term. `combine` sums the registered losses
with a non-zero weight. Every loss, the ones below (and the layer losses of students/losses/layers.py) as
one a package registers, is set the same way, under the student's `losses:` ({NAME: weight} or {NAME: {weight:
W, SETTING: value}}), so registering one changes no setting, flag or cache key of the students that do not use it.

Batches are dicts keyed by the schema's column names; they carry the gold label as -1 where the
row has none (augmented or unlabeled text): the CE term averages over labeled rows only.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from students.data import NO_LABEL, TEACHER_LAYERS
from students.losses import layers as layer_losses
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.runtime.registry import Registry

# What a loss needing the teacher run alongside declares (students/losses/online.py adds its states to the batch).
ONLINE = layer_losses.TEACHER_STATES
# A loss's role, which phase plans and families ask instead of its name: gold (the labels alone), prediction (the
# teacher's logits), representation (a pooled state against the teacher's), layer (token-level states, the teacher
# run alongside).
GOLD, PREDICTION, REPRESENTATION, LAYER = ROLES = ("gold", "prediction", "representation", "layer")


@dataclass(frozen=True)
class NoSettings:
    """A loss without settings of its own."""


@dataclass(frozen=True)
class Loss:
    name: str
    fn: Callable[[Mapping[str, Any], Mapping[str, Any], "LossWeights"], torch.Tensor]  # the unweighted term
    needs: tuple[str, ...]  # batch keys it reads besides the label and mask (ONLINE: the online teacher)
    settings: type  # frozen dataclass of its own settings (`losses: {NAME: {weight: W, SETTING: V}}`)
    role: str = PREDICTION  # one of ROLES
    reads: tuple[str, ...] = ("logits",)  # the student's outputs it reads (a family gives them: Family.outputs)
    per_pair: bool = False  # a layer loss computed on each mapped (student, teacher) layer pair


# Every module of students.losses registers its losses when the registry is first read; losses of other
# packages come through the entry point group (transferset/runtime/registry.py).
_REGISTRY: Registry[Loss] = Registry("loss", "transferset.losses", "students.losses")


def register(name: str, *, needs: tuple[str, ...] = (), settings: type = NoSettings, role: Optional[str] = None,
             reads: tuple[str, ...] = ("logits",), per_pair: bool = False):
    """Register fn(outputs, batch, weights) → its unweighted term under `name` (`weights.settings(name)`:
    its settings), with its role (ROLES; None: gold when it reads no teacher column, else prediction) and the
    student's outputs it reads."""
    _REGISTRY.check_free(name)
    role = role or (PREDICTION if needs else GOLD)
    if role not in ROLES:
        raise ValueError(f"loss {name!r}: role {role!r} is not one of {', '.join(ROLES)}")
    if not (dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen):
        raise ValueError(f"loss {name!r}: settings must be a frozen dataclass, got {settings!r}")
    if "weight" in {f.name for f in dataclasses.fields(settings)}:
        raise ValueError(f"loss {name!r}: `weight` is every loss's weight, not a setting of its own")

    def deco(fn: Callable) -> Callable:
        _REGISTRY.add(name, Loss(name, fn, tuple(needs), settings, role, tuple(reads), per_pair), by=fn.__module__)
        return fn

    return deco


def get(name: str) -> Loss:
    """The loss of that name; an unknown one is a RegistryError (a UserError) naming the known ones."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    """Every registered loss, in the order combine adds them."""
    return _REGISTRY.names()


def of_role(*roles: str) -> tuple[str, ...]:
    """The registered losses of these roles, in the order combine adds them."""
    return tuple(name for name in _REGISTRY.names() if _REGISTRY[name].role in roles)


def per_pair() -> tuple[str, ...]:
    """The layer losses computed on each mapped layer pair (a pkt stage trains one layer on them)."""
    return tuple(name for name in _REGISTRY.names() if _REGISTRY[name].per_pair)


class LossWeights:
    """The weight of each registered loss (0.0 unless given), kd's temperature, and a progressive-knowledge-
    transfer stage's layers (None: all). `LossWeights(kd=1.0, temperature=2.0)`; `w.kd` is kd's weight."""

    def __init__(self, temperature: float = 1.0, layers: Optional[Tuple[int, ...]] = None,
                 settings: Optional[Mapping[str, Any]] = None, **weights: float):
        for name in weights:
            get(name)  # an unknown name lists the known ones
        self.weights = {name: float(w) for name, w in weights.items()}
        self.temperature = temperature
        self.layers = layers
        self._settings = dict(settings or {})  # name → its settings object, for the losses that have some

    def __getattr__(self, name: str) -> float:
        if name.startswith("_") or name not in _REGISTRY:
            raise AttributeError(name)
        return self.weights.get(name, 0.0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LossWeights) and (self.active(), self.temperature, self.layers, self._settings) == (
            other.active(), other.temperature, other.layers, other._settings)

    def __repr__(self) -> str:
        return f"LossWeights({self.active()}, temperature={self.temperature}, layers={self.layers})"

    def replace(self, **weights: float) -> "LossWeights":
        """These weights with some changed (as dataclasses.replace)."""
        return LossWeights(self.temperature, self.layers, self._settings, **{**self.weights, **weights})

    def settings(self, name: str) -> Any:
        """A loss's own settings (its dataclass's defaults unless the student's `losses:` gives some)."""
        return self._settings.get(name) or get(name).settings()

    def active(self) -> dict[str, float]:
        """The losses with a non-zero weight, in the registry's order (the order combine adds them)."""
        return {name: self.weights[name] for name in _REGISTRY if self.weights.get(name)}

    def needs(self) -> set[str]:
        """What the active losses read of a batch besides its tokens and labels (cached columns such as
        teacher_logits, TEACHER_LAYERS, ONLINE): the columns the batches hold (students.data.iter_train_batches)."""
        return {key for name in self.active() for key in _REGISTRY[name].needs}

    def layer_active(self) -> dict[str, float]:
        """The active losses that need the teacher's token-level states (the online teacher)."""
        return {k: v for k, v in self.active().items() if ONLINE in _REGISTRY[k].needs}

    @classmethod
    def of(cls, cfg) -> "LossWeights":
        """The weights and settings a StudentConfig's `losses:` sets (kd's temperature among them)."""
        weights, settings = {}, {}
        for name, value in cfg.losses.items():
            weights[name], settings[name] = _weight_and_settings(get(name), value)
        kd = settings.pop("kd", KD())  # held as `temperature`, which the kd term and the phases read
        return cls(temperature=kd.temperature, settings=settings, **weights)


def _weight_and_settings(loss: Loss, value: Any) -> tuple[float, Any]:
    """`losses: {NAME: value}`: a weight, or {weight: W, SETTING: value} → (W, its settings object)."""
    where = f"losses: {{{loss.name}: {value!r}}}"
    if not isinstance(value, dict):
        value = {"weight": value}
    values = dict(value)
    weight = values.pop("weight", None)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
        raise UserError(f"{where}: the weight must be a number >= 0, e.g. {{{loss.name}: 1.0}}")
    known = [f.name for f in dataclasses.fields(loss.settings)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown setting(s) {unknown} of loss {loss.name}; known: {['weight', *known]}")
    try:
        return float(weight), loss.settings(**values)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None


def canonical(losses: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A student's `losses:` in one form whatever its spelling (`kd: 1` and `kd: {weight: 1.0, temperature: 1.0}`
    alike): each loss with a non-zero weight → {weight, each of its settings at its value}, for stage keys and
    checkpoints' fingerprints."""
    out = {}
    for name, value in losses.items():
        weight, settings = _weight_and_settings(get(name), value)
        if weight:
            out[name] = {"weight": weight, **dataclasses.asdict(settings)}
    return out


def check(losses: Mapping[str, Any], where: str) -> None:
    """Refuse a student's `losses:` that names an unknown loss or setting (before any stage of a run)."""
    for name, value in losses.items():
        try:
            _weight_and_settings(get(name), value)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None


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


# --- the losses of the cached teacher columns, then the layer losses (registry order: combine's order) ---

@dataclass(frozen=True)
class KD:
    """kd's settings: `losses: {kd: {weight: 1.0, temperature: 2.0}}`."""

    temperature: float = 1.0  # T: both distributions softened by it, the term scaled by T²

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature > 0:
            raise ValueError(f"temperature {self.temperature!r}: a number above 0, e.g. 2.0")


register("ce", role=GOLD)(lambda out, batch, w: ce(out["logits"], batch[schema.LABEL]))
register("mse", needs=(schema.TEACHER_LOGITS,))(
    lambda out, batch, w: logits_mse(out["logits"], batch[schema.TEACHER_LOGITS]))
register("kd", needs=(schema.TEACHER_LOGITS,), settings=KD)(
    lambda out, batch, w: kd_kl(out["logits"], batch[schema.TEACHER_LOGITS], w.temperature))
register("repr", needs=(schema.TEACHER_HIDDEN,), role=REPRESENTATION, reads=("repr",))(
    lambda out, batch, w: repr_mse(out["repr"], batch[schema.TEACHER_HIDDEN]))
register("pkd", needs=(TEACHER_LAYERS,), role=REPRESENTATION, reads=("cls_layers",))(
    lambda out, batch, w: pkd(out["cls_layers"], batch[TEACHER_LAYERS]))


def _layer_loss(name: str) -> None:
    """The loss registry's entry of LAYER_TERMS[name]: the online teacher runs alongside for it."""
    register(name, needs=(ONLINE,), role=LAYER, reads=(layer_losses.STUDENT_STATES,),
             per_pair=layer_losses.LAYER_TERMS[name].per_pair)(
        lambda out, batch, w: layer_losses.term(name, out[layer_losses.STUDENT_STATES],
                                                batch[layer_losses.TEACHER_STATES], out[layer_losses.LAYER_PAIRS],
                                                batch["mask"], w.layers))


def register_layer(name: str, reads: str, fn: Callable) -> Callable:
    """Register a layer loss: `fn(student States, teacher States, s, t, mask)`, its unweighted term on one mapped
    layer pair (reads hidden or attention: averaged over the pairs) or on the embeddings / the last layers (reads
    embeddings or last: s and t are 0 or -1); the online teacher captures what it reads (layers.READS)."""
    if reads not in layer_losses.READS:
        raise ValueError(f"layer loss {name!r}: reads {reads!r} is not one of {', '.join(layer_losses.READS)}")
    _REGISTRY.check_free(name)
    layer_losses.LAYER_TERMS[name] = layer_losses.LayerTerm(reads, fn)
    _layer_loss(name)
    return fn


for _name in list(layer_losses.LAYER_TERMS):
    _layer_loss(_name)


def combine(outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor],
            weights: LossWeights) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted sum of the active losses (registry order); also each term's value for logging."""
    w = weights.active()
    if not w:
        raise ValueError("no loss has a non-zero weight")
    online = sorted(k for k in w if ONLINE in _REGISTRY[k].needs)
    if online and ONLINE not in batch:
        raise ValueError(f"{online} need the teacher's token-level states: none in the batch "
                         "(students.losses.online.forward adds them)")
    for name in w:
        missing = [key for key in _REGISTRY[name].needs if key not in batch]
        if missing:
            raise ValueError(f"loss {name} reads {missing} of the batch, which has {sorted(batch)}: a scored set's "
                             "columns (students.data.TRAIN_COLUMNS) or the online teacher's states")
    parts = {name: _REGISTRY[name].fn(outputs, batch, weights) for name in w}
    total: Optional[torch.Tensor] = None
    for name, value in parts.items():
        term = w[name] * value
        total = term if total is None else total + term
    assert total is not None
    return total, {k: float(v.detach()) for k, v in parts.items()}
