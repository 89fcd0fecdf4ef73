"""Attention-head pruning of BERT classifiers (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

    importance = head_importance(model, batches)          # (L, H): summed |dL/d mask_h| per row
    remove = least_important(importance, 4)               # {layer: [heads]}, at least one head kept per layer
    pruned = prune_heads(model, remove)                   # a PrunedBertForSequenceClassification

transformers 5 dropped `prune_heads` and the `pruned_heads` config entry, so the heads are removed here:
the removed heads' rows of the query, key and value projections and their columns of the attention
output projection are sliced away, which is exactly the model with those heads masked (their context
zeroed before the output projection). Layers then differ in head count, which BertConfig cannot say, so
the pruned model is a BERT variant whose config carries the heads each layer keeps (`kept_heads`,
original head indices): model_type `transferset_pruned_bert`. `register()` (called by transferset's
loaders) makes transformers' Auto classes know it, so outside transferset:

    import transferset.models.pruning; transferset.models.pruning.register()
    AutoModelForSequenceClassification.from_pretrained(DIR)   # or PrunedBertForSequenceClassification.from_pretrained

transformers is imported inside the functions (and the classes are made on first use): importing
this module costs nothing.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

MODEL_TYPE = "transferset_pruned_bert"
# What the importance is the gradient of: cross-entropy against the gold labels, or against the
# model's own predicted labels for rows without one. KL against its own predicted distribution is not
# offered: its gradient is zero at the model's own output, whatever the head.
IMPORTANCE_LOSSES = ("labels", "predicted")

_classes: dict[str, Any] = {}


def _make_classes() -> dict[str, Any]:
    if _classes:
        return _classes
    import torch.nn as nn
    from transformers import BertConfig, BertForSequenceClassification

    class PrunedBertConfig(BertConfig):
        """BertConfig + `kept_heads`: per layer, the original indices of the attention heads kept.

        `num_attention_heads` stays the unpruned count, so the head size (hidden_size / heads) is the
        original one."""

        model_type = MODEL_TYPE

        def __init__(self, kept_heads: Optional[Sequence[Sequence[int]]] = None, **kwargs):
            super().__init__(**kwargs)
            heads = int(self.num_attention_heads)
            if kept_heads is None:
                kept_heads = [list(range(heads))] * int(self.num_hidden_layers)
            kept = [sorted(int(h) for h in layer) for layer in kept_heads]
            if len(kept) != int(self.num_hidden_layers):
                raise ValueError(f"kept_heads lists {len(kept)} layers for a model of {self.num_hidden_layers}")
            for layer, hs in enumerate(kept):
                if not hs or len(set(hs)) != len(hs) or hs[0] < 0 or hs[-1] >= heads:
                    raise ValueError(f"kept_heads[{layer}] = {hs}: expected 1 to {heads} distinct heads in "
                                     f"0..{heads - 1}")
            self.kept_heads = kept

    class PrunedBertForSequenceClassification(BertForSequenceClassification):
        """BertForSequenceClassification whose layer l has len(config.kept_heads[l]) attention heads.

        The modules are BERT's own with narrower query/key/value and attention-output projections:
        BertSelfAttention's forward infers the head count from the projection's width."""

        config_class = PrunedBertConfig

        def __init__(self, config):
            super().__init__(config)
            size = int(config.hidden_size) // int(config.num_attention_heads)
            for layer, kept in zip(self.bert.encoder.layer, config.kept_heads):
                sa, out = layer.attention.self, layer.attention.output
                width = len(kept) * size
                if width == sa.all_head_size:
                    continue
                sa.query, sa.key, sa.value = (nn.Linear(config.hidden_size, width) for _ in range(3))
                out.dense = nn.Linear(width, config.hidden_size)
                sa.num_attention_heads, sa.all_head_size = len(kept), width

    _classes.update(config=PrunedBertConfig, model=PrunedBertForSequenceClassification)
    return _classes


def register() -> None:
    """Make AutoConfig and AutoModelForSequenceClassification load `transferset_pruned_bert` directories
    (idempotent)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, CONFIG_MAPPING

    classes = _make_classes()
    if MODEL_TYPE in CONFIG_MAPPING:
        return
    AutoConfig.register(MODEL_TYPE, classes["config"])
    AutoModelForSequenceClassification.register(classes["config"], classes["model"])


def pruned_classes() -> tuple[Any, Any]:
    """(PrunedBertConfig, PrunedBertForSequenceClassification)."""
    register()
    return _classes["config"], _classes["model"]


def unsupported(model) -> Optional[str]:
    """Why `model`'s heads cannot be pruned here, or None."""
    from transformers import BertForSequenceClassification

    _, pruned = pruned_classes()
    if type(model) not in (BertForSequenceClassification, pruned):
        return (f"{type(model).__name__} is not a BERT sequence classifier (BertForSequenceClassification); "
                "head pruning covers BERT models (the MiniLM teacher, BERT fine-tunes, transformer students of them)")
    if getattr(model.config, "is_decoder", False) or getattr(model.config, "add_cross_attention", False):
        return "a decoder BERT (causal or cross attention)"
    return None


def kept_heads(model) -> list[list[int]]:
    """Per layer, the original indices of the heads the model has."""
    heads = int(model.config.num_attention_heads)
    kept = getattr(model.config, "kept_heads", None)
    return [list(k) for k in kept] if kept is not None else [list(range(heads))] * int(model.config.num_hidden_layers)


def head_size(model) -> int:
    return int(model.config.hidden_size) // int(model.config.num_attention_heads)


# --------------------------------------------------------------------------- importance


@contextlib.contextmanager
def head_gates(model, gates: Optional[Mapping[int, Any]] = None) -> Iterator[dict]:
    """Within the block, each layer's attention context (B, T, heads·d) is multiplied per head by a gate
    before the output projection: Michel et al.'s mask ξ_h. `gates[layer]` is (heads,) or (B, heads)
    (one gate per row: the gradient of a summed loss is then each row's own); layers not given are
    left alone. The yielded dict is `gates`, which the caller may fill per batch."""
    gates = {} if gates is None else gates
    size = head_size(model)
    handles = []

    def hook(module, _inputs, output, layer):
        gate = gates.get(layer)
        if gate is None:
            return output
        context = output[0]
        b, t, width = context.shape
        g = gate.reshape(-1, 1, width // size, 1) if gate.dim() == 2 else gate.reshape(1, 1, -1, 1)
        return (context.view(b, t, width // size, size).mul(g.to(context.dtype)).view(b, t, width), *output[1:])

    try:
        for layer, block in enumerate(model.bert.encoder.layer):
            handles.append(block.attention.self.register_forward_hook(
                lambda m, i, o, layer=layer: hook(m, i, o, layer)))
        yield gates
    finally:
        for h in handles:
            h.remove()


def head_importance(model, batches: Iterable[dict], *, loss: str = "labels",
                    forward: Optional[Callable[[Any, dict], Any]] = None) -> np.ndarray:
    """(L, H) importance of each head, in original head indices (NaN for heads already removed):
    Σ over rows of |∂loss_row/∂ξ_h| (Michel et al. 2019, eq. 4, unnormalised).

    `batches`: dicts of the model's inputs (input_ids, attention_mask, token_type_ids) and `labels`
    (class index, -100 or below 0 for none). `loss`: "labels" takes the gold label where a row has one
    and the model's own predicted label where it has none; "predicted" always the predicted label.
    `forward(model, batch) -> logits` replaces `model(**inputs).logits`.
    """
    import torch
    import torch.nn.functional as F

    if loss not in IMPORTANCE_LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {IMPORTANCE_LOSSES}")
    kept = kept_heads(model)
    total = [np.zeros(len(k), dtype=np.float64) for k in kept]
    was_training = model.training
    model.eval()  # no dropout: the gradient of the model as it predicts
    params = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    if forward is None:
        def forward(m, batch):
            return m(**{k: v for k, v in batch.items() if k != "labels"}).logits
    device = next(model.parameters()).device
    try:
        with head_gates(model) as gates:
            for batch in batches:
                rows = len(batch["labels"]) if "labels" in batch else len(next(iter(batch.values())))
                for layer, k in enumerate(kept):
                    gates[layer] = torch.ones(rows, len(k), device=device, requires_grad=True)
                logits = forward(model, batch).float()
                target = logits.argmax(-1).detach()
                if loss == "labels" and "labels" in batch:
                    gold = batch["labels"].to(device)
                    target = torch.where(gold >= 0, gold, target)
                # Summed, not averaged: each row's gate gets its own row's gradient.
                F.cross_entropy(logits, target, reduction="sum").backward()
                for layer in range(len(kept)):
                    total[layer] += gates[layer].grad.abs().sum(0).double().cpu().numpy()
    finally:
        for p, flag in zip(model.parameters(), params):
            p.requires_grad_(flag)
        model.train(was_training)
    out = np.full((len(kept), int(model.config.num_attention_heads)), np.nan)
    for layer, k in enumerate(kept):
        out[layer, k] = total[layer]
    return out


def normalize_by_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's scores divided by their L2 norm (Michel et al.'s code does this before a global
    ranking: layers' gradients differ in scale); a layer of zeros stays zero."""
    norms = np.sqrt(np.nansum(importance ** 2, axis=1, keepdims=True))
    return importance / np.where(norms > 0, norms, 1.0)


def heads_to_remove(count_or_fraction: float, have: int) -> int:
    """How many heads `--heads` means: a count (≥ 1, an integer) or a fraction of the `have` heads the
    model has (rounded)."""
    value = float(count_or_fraction)
    if 0 < value < 1:
        return int(round(value * have))
    if value >= 1 and value == int(value):
        return int(value)
    raise ValueError("expected a number of heads (1, 2, ...) or a fraction in (0, 1)")  # the caller names the value


def least_important(importance: np.ndarray, count: int, *, normalize: bool = True) -> dict[int, list[int]]:
    """The `count` least important heads as {layer: [original head indices]}; every layer keeps at least
    one head (a layer without attention is not a BERT layer any more). Ties go to the lower (layer, head)."""
    scores = normalize_by_layer(importance) if normalize else importance
    left = np.isfinite(scores).sum(axis=1)
    can = int((left - 1).clip(min=0).sum())
    if count > can:
        raise ValueError(f"cannot remove {count} heads: the model has {int(left.sum())} in {len(left)} layers and "
                         f"each layer keeps at least one, so at most {can} can go")
    order = sorted(((float(scores[l, h]), l, h) for l, h in zip(*np.nonzero(np.isfinite(scores)))))
    chosen: dict[int, list[int]] = {}
    taken = 0
    for _, l, h in order:
        if taken == count:
            break
        if left[l] > 1:
            chosen.setdefault(int(l), []).append(int(h))
            left[l] -= 1
            taken += 1
    return {l: sorted(hs) for l, hs in sorted(chosen.items())}


# --------------------------------------------------------------------------- removal


def prune_heads(model, remove: Mapping[int, Sequence[int]]):
    """A PrunedBertForSequenceClassification without the heads `remove` ({layer: original head indices});
    `model` (a BERT classifier, pruned or not) is left as it is. The kept heads' weights are the original
    slices, so before any training its output is `model`'s with those heads' gates at zero."""
    import torch

    reason = unsupported(model)
    if reason:
        raise ValueError(reason)
    config_class, model_class = pruned_classes()
    kept = kept_heads(model)
    for layer, hs in remove.items():
        if not 0 <= int(layer) < len(kept):
            raise ValueError(f"layer {layer}: the model has {len(kept)} layers")
        gone = [h for h in hs if h not in kept[int(layer)]]
        if gone:
            raise ValueError(f"layer {layer}: heads {gone} are not in the model (it has {kept[int(layer)]})")
    new_kept = [[h for h in k if h not in set(remove.get(layer, ()))] for layer, k in enumerate(kept)]
    values = model.config.to_dict()
    for key in ("model_type", "kept_heads", "transformers_version"):
        values.pop(key, None)
    config = config_class(kept_heads=new_kept, **values)
    config.architectures = [model_class.__name__]
    config._attn_implementation = model.config._attn_implementation
    size = head_size(model)
    state = dict(model.state_dict())
    for layer, (old, new) in enumerate(zip(kept, new_kept)):
        if old == new:
            continue
        rows = torch.cat([torch.arange(old.index(h) * size, (old.index(h) + 1) * size) for h in new])
        prefix = f"bert.encoder.layer.{layer}.attention."
        for proj in ("query", "key", "value"):
            for part in ("weight", "bias"):
                key = f"{prefix}self.{proj}.{part}"
                state[key] = state[key].index_select(0, rows)
        key = f"{prefix}output.dense.weight"
        state[key] = state[key].index_select(1, rows)
    dtype = next(model.parameters()).dtype
    pruned = model_class(config).to(dtype)
    pruned.load_state_dict(state, strict=True)
    return pruned.to(next(model.parameters()).device).train(model.training)
