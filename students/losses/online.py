"""The teacher run alongside the student, for the layer losses (TinyBERT, MobileBERT, MiniLM, DistilBERT).

Every token's hidden state and attention map of several layers is far too much to cache for millions of
rows, so while a layer loss is active the trainer runs the scored set's teacher on the student's own
batches (the same input_ids and attention mask: the student must tokenize as the teacher does), in eval
mode and without gradients, and adds its states to the batch (`forward`). The prediction-layer targets
(logits, pooled states, PKD's [CLS] per layer) still come from the scored Parquet: the set is scored once.

What it costs: one teacher forward per training batch (no backward). Measured by benchmarks/layerwise.py
(benchmarks/README.md, MiniLM teacher, 3-layer student, 1 thread): 62 ms per row with the logits alone,
86 ms with TinyBERT's losses, 100 ms with MiniLM's; the teacher's forward alone is 29 ms per row.

Across widths the student's hidden states go through W_h (TinyBERT's fit_dense, one Linear shared by the
embeddings and every layer, as in TinyBERT's code): it learns with the student and is dropped at the end,
as students.families.projection is; the saved student is a plain model of its own width. Attention and
value-relation losses need no projection (heads compare L × L maps), but as many heads as the teacher's.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from students import families
from students.data.teacher_files import NO_CODE_TRAIN, no_teacher_dir
from students.families import Built, Context
from students.families import transformer_layers, transformer_maps
from students.losses import LossWeights
from students.losses import layers as layer_losses
from students.losses.layers import States
from transferset.contract import schema
from transferset.runtime.errors import ConfigError, UserError

# Two texts in which tokenizers differ most (case, accents, punctuation, digits, a pair).
PROBE = (["Hello, WORLD! Naïve café: 1,234 un-believable ##x [unused]", "Ünïcödé — ok?"], ["b", "Zürich"])


def layer_weights(cfg) -> dict[str, float]:
    """The layer losses the settings turn on (any phase plan's phase may use them)."""
    return LossWeights.of(cfg).layer_active()


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers give the same ids: the same vocabulary and the same splitting of PROBE."""
    if a.get_vocab() != b.get_vocab():
        return False
    return a(*PROBE)["input_ids"] == b(*PROBE)["input_ids"]


class OnlineTeacher(nn.Module):
    """The teacher (held, not a submodule: its parameters never reach an optimiser) and W_h (a submodule)."""

    def __init__(self, teacher: nn.Module, pairs: list[tuple[int, int]], projection: Optional[nn.Module]):
        super().__init__()
        self.__dict__["teacher"] = teacher.eval().requires_grad_(False)
        self.pairs = pairs
        self.proj = projection

    def _teacher_on(self, device: torch.device) -> nn.Module:
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        return self.teacher

    def forward(self, model: nn.Module, batch: dict, weights: LossWeights) -> dict:
        """The student's outputs with its token-level states; the teacher's states added to `batch`."""
        active = weights.layer_active()
        pairs = [(s, t) for s, t in self.pairs if weights.layers is None or s in weights.layers]
        attention = bool(layer_losses.reading(layer_losses.ATTENTION, active))
        s_layers = sorted({s for s, _ in pairs}) if attention else []
        t_layers = sorted({t for _, t in pairs}) if attention else []
        ids, mask, types = batch["ids"], batch["mask"], batch.get("type_ids")
        out = transformer_layers.forward(model, ids, mask, types, states=s_layers)
        teacher = self._teacher_on(ids.device)
        with torch.no_grad():
            t_out = transformer_layers.forward(teacher, ids, mask, types, states=t_layers)
        batch[layer_losses.TEACHER_STATES] = States(t_out["hidden_states"], t_out["qkv"])
        hidden = list(out["hidden_states"])
        needed = ({0} if layer_losses.reading(layer_losses.EMBEDDINGS, active) else set()) \
            | ({len(hidden) - 1} if layer_losses.reading(layer_losses.LAST, active) else set())
        needed |= {s for s, _ in pairs} if layer_losses.reading(layer_losses.HIDDEN, active) else set()
        if self.proj is not None:
            hidden = [self.proj(h) if k in needed else None for k, h in enumerate(hidden)]
        out[layer_losses.STUDENT_STATES] = States(hidden, out["qkv"])
        out[layer_losses.LAYER_PAIRS] = self.pairs
        return out


def forward(s, batch: dict, weights: Optional[LossWeights]) -> dict:
    """The loss step's forward: the family's, plus the layer states when a layer loss of `weights` is active
    (the teacher's added to `batch`). `s` is the run's Setup, or anything with its model, family and online."""
    online = getattr(s, "online", None)
    if online is None or weights is None or not weights.layer_active():
        return s.family.forward(s.model, batch)
    return online(s.model, batch, weights)


def parameters(s) -> list[nn.Parameter]:
    """What learns with the student besides its model: W_h, when the online teacher has one."""
    online = getattr(s, "online", None)
    return list(online.parameters()) if online is not None else []


def check_same_teacher(ctx: Context, names: str) -> None:
    """Refuse an online teacher whose weights are not the ones that scored the set: the layer losses would pull
    the student towards one model's states and the cached logits towards another's, with no error anywhere.
    The set records its teacher's weights hash (for an ensemble, the primary member's, the one run online)."""
    from transferset.models.loading import weights_sha256

    recorded = ctx.meta.get(schema.META_TEACHER_SHA256)
    if not recorded:
        return  # a set that records no hash (written by hand): nothing to compare with
    try:
        ours = weights_sha256(ctx.teacher_dir)
    except UserError:
        return  # no or refused weights: load_classifier below says what is wrong with the folder
    if ours != recorded:
        raise ConfigError(f"{names}: the teacher {ctx.teacher_dir} (weights sha256 {ours}) is not the one that "
                          f"scored {ctx.transfer_dir} (sha256 {recorded}): set `teacher:` to the teacher that "
                          "scored the set, or score the set again with this teacher")


def make(ctx: Context, built: Built) -> Optional[OnlineTeacher]:
    """The online teacher of a run whose settings turn a layer loss on, else None; refuses what cannot work."""
    from transferset.models.loading import load_classifier, load_tokenizer

    cfg = ctx.cfg
    active = layer_weights(cfg)
    if not active:
        return None  # the phase plans refuse a two-step / pkt plan without its layer losses (students.phases)
    names = ", ".join(sorted(active))
    if not families.get(cfg.student).layer_losses:
        raise UserError(f"{names} compare a transformer's per-token hidden states and attention maps with the "
                        f"teacher's; a {cfg.student} student has neither: use `student: transformer`, or set "
                        f"{names} to 0")
    if ctx.teacher_dir is None:
        raise no_teacher_dir(ctx.meta, f"{names} (the teacher runs alongside the student)", f"set {names} to 0")
    check_same_teacher(ctx, names)
    model = built.model
    tokenizer = getattr(built.tokens, "tokenizer", None)
    try:
        theirs = load_tokenizer(ctx.teacher_dir, remedy=NO_CODE_TRAIN)
    except (OSError, ValueError) as exc:
        raise UserError(f"{ctx.teacher_dir}: cannot load the teacher's tokenizer ({exc}); {names} feed the "
                        "student's tokens to the teacher and need its tokenizer beside it") from exc
    if tokenizer is None or getattr(built.tokens, "remap", None) is not None or not same_tokenizer(tokenizer, theirs):
        raise UserError(f"{names} run the teacher on the student's tokens, and the student's tokenizer differs "
                        f"from the teacher's ({ctx.teacher_dir}): use a student built from the teacher "
                        "(drop `model: {pretrained: ...}` or `tokenizer:`), or set them to 0")
    try:
        teacher = load_classifier(ctx.teacher_dir, remedy=NO_CODE_TRAIN)
        n_student = len(transformer_layers.encoder_layers(model))
        n_teacher = len(transformer_layers.encoder_layers(teacher))
        pairs = transformer_maps.layer_pairs(cfg.layer_map, n_student, n_teacher)
    except ValueError as exc:
        raise UserError(f"{names}: {exc}") from exc
    if layer_losses.reading(layer_losses.ATTENTION, active):
        heads_s, heads_t = int(model.config.num_attention_heads), int(teacher.config.num_attention_heads)
        if heads_s != heads_t:
            # MiniLM v1 and TinyBERT compare head by head; MiniLM v2's relation heads are out of scope.
            raise UserError(f"{', '.join(layer_losses.reading(layer_losses.ATTENTION, active))} compare "
                            f"attention head by head: the student has {heads_s} heads, the teacher {heads_t}; set "
                            f"model: {{num_attention_heads: {heads_t}}}, or drop the attention losses")
    if cfg.phases == "pkt" and cfg.weight("emb_mse") and families.frozen_embeddings(cfg):
        raise UserError("phases: pkt trains the embeddings alone on emb_mse first, and freeze_embeddings keeps "
                        "them fixed: drop one of the two")
    if cfg.phases == "pkt":
        unmapped = sorted(set(range(1, n_student + 1)) - {s for s, _ in pairs})
        if unmapped:
            raise UserError(f"phases: pkt trains each student layer on its teacher layer, and layer_map "
                            f"{cfg.layer_map!r} maps no teacher layer to student layers {unmapped}; use "
                            "layer_map: uniform")
    width_s, width_t = int(model.config.hidden_size), int(teacher.config.hidden_size)
    projection = None
    if width_s != width_t and any(k in active for k in ("emb_mse", "hidden_mse", "cos")):
        projection = nn.Linear(width_s, width_t)
    return OnlineTeacher(teacher, pairs, projection)
