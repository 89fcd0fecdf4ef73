"""Where a Hugging Face encoder keeps its layers and their query / key / value projections, and its forward
pass with the states the layer losses compare: shared by the transformer student (students/families/transformer.py),
the online teacher and the layer losses, for every encoder family.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Optional, Sequence

import torch
import torch.nn as nn


# The query / key / value projections of a self-attention block, by architecture: BERT and its kin (RoBERTa,
# XLM-R, ELECTRA), DeBERTa-v2/v3, DistilBERT, MPNet; ModernBERT's are one fused Linear (FUSED_QKV).
QKV_NAMES = (("query", "key", "value"), ("query_proj", "key_proj", "value_proj"), ("q_lin", "k_lin", "v_lin"),
             ("q", "k", "v"))
FUSED_QKV = ("Wqkv",)
# Where each family keeps its list of layers, under the base model: BERT and its kin, DeBERTa, ELECTRA,
# MPNet: encoder.layer; DistilBERT: transformer.layer; ModernBERT: layers.
LAYER_LISTS = ("encoder.layer", "transformer.layer", "layers")


def layer_list(model: nn.Module) -> str:
    """The path of the encoder's layer list under the base model (one of LAYER_LISTS)."""
    base = model.base_model
    for path in LAYER_LISTS:
        obj = base
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return path
    raise ValueError(f"{type(model).__name__}: its layers are in none of {', '.join(LAYER_LISTS)}; a student cut "
                     "from this teacher needs them: set init: random (its architecture only), or start from a "
                     "pretrained checkpoint (model: {pretrained: ...})")


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder's layer list of a Hugging Face encoder (LAYER_LISTS)."""
    obj = model.base_model
    for part in layer_list(model).split("."):
        obj = getattr(obj, part)
    return obj


def qkv_modules(layer: nn.Module) -> tuple[nn.Module, ...]:
    """The Linear modules that make a layer's queries, keys and values: three, or one fused (Q | K | V)."""
    named = dict(layer.named_modules())
    for names in QKV_NAMES:
        by = {n.split(".")[-1]: m for n, m in named.items() if n.split(".")[-1] in names}
        if len(by) == 3:
            return by[names[0]], by[names[1]], by[names[2]]
    fused = [m for n, m in named.items() if n.split(".")[-1] in FUSED_QKV]
    if len(fused) == 1:
        return (fused[0],)
    raise ValueError(f"{type(layer).__name__}: no query/key/value projections found; the attention losses take "
                     f"self-attention with projections named {', '.join('/'.join(n) for n in QKV_NAMES)} or a "
                     f"fused {'/'.join(FUSED_QKV)}")


@contextlib.contextmanager
def capture_attention(model: nn.Module, layers: Sequence[int]):
    """Within the block, each forward of `model` records the query, key and value projections of its 1-based
    `layers` in the yielded dict: {k: (q, k, v)}, each (B, heads, L, d_k).

    Forward hooks on the projections, so the attention kernel (eager, SDPA, ...) stays the model's own and
    nothing is computed twice; scores Q·Kᵀ/√d_k are formed only where a loss needs them
    (students.losses.layers.States). The tensors keep their autograd graph. `output_attentions` would not
    do: in transformers 5 it needs eager attention and returns probabilities after the softmax (and after
    attention dropout while training), not TinyBERT's scores.
    """
    heads = int(model.config.num_attention_heads)
    found: dict[int, list] = {}
    handles = []
    blocks = encoder_layers(model)
    try:
        for k in sorted(set(layers)):
            if not 1 <= k <= len(blocks):
                raise ValueError(f"layer {k}: the model has {len(blocks)} layers")
            modules = qkv_modules(blocks[k - 1])
            for slot, module in enumerate(modules):
                def hook(_module, _inputs, output, k=k, slot=slot, fused=len(modules) == 1):
                    states = found.setdefault(k, [None, None, None])
                    if states[slot] is not None:
                        # The first call is the tokens' projection; DeBERTa calls the same projections again on
                        # its relative position embeddings (share_att_key), which are not the layer's Q/K/V.
                        return
                    b, length, width = output.shape
                    parts = output.chunk(3, dim=-1) if fused else (output,)   # fused: Q | K | V along the width
                    for i, part in enumerate(parts):
                        states[slot + i] = part.reshape(b, length, heads, part.shape[-1] // heads).transpose(1, 2)
                handles.append(module.register_forward_hook(hook))
        yield found
    finally:
        for h in handles:
            h.remove()


def forward(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            type_ids: Optional[torch.Tensor] = None, states: Optional[Sequence[int]] = None) -> dict:
    """Any Hugging Face sequence classifier → logits, repr and the [CLS] state of every layer.

    With `states` (1-based layers, possibly empty), also "hidden_states" (embeddings and every layer, each
    (B, L, H)) and "qkv" ({layer: (q, k, v)} of those layers, see capture_attention): what the layer losses
    compare (students/losses/online.py).
    """
    kwargs = {"input_ids": ids, "attention_mask": mask.long(), "output_hidden_states": True}
    # DistilBERT-like models take no token types; a pair's types only matter to models that have them.
    if type_ids is not None and "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = type_ids
    with (capture_attention(model, states) if states else contextlib.nullcontext({})) as qkv:
        out = model(**kwargs)
    cls = torch.stack([h[:, 0] for h in out.hidden_states[1:]], dim=1)  # (B, L, H)
    # repr: [CLS] of the last layer, what `transferset score` stores as teacher_hidden by default.
    result = {"logits": out.logits, "repr": cls[:, -1], "cls_layers": cls}   # (B, C), (B, H), (B, L, H)
    if states is not None:
        result.update(hidden_states=out.hidden_states, qkv={k: tuple(v) for k, v in qkv.items()})
    return result
