"""Padding-free forward pass for BERT classifiers: every matmul runs on real tokens only.

A padded batch spends FLOPs on pad tokens. Sorting rows by length (scoring.Teacher) cuts that
waste but still leaves ~15 % on SST-2 and keeps forward batches small. Here the rows of a forward
batch are packed into one (tokens, hidden) matrix: the linear layers, nearly all of the FLOPs, run
once over the packed tokens (query, key and value as one matmul), and attention runs per group of
rows of equal length, so there is no padding and no attention mask anywhere.

Only `BertForSequenceClassification` (the default MiniLM teacher and every BERT fine-tune) has
this path, and `BertForMaskedLM` for the tinybert recipe's MLM candidates (PackedMaskedLM: the
vocabulary head on the masked tokens only); other architectures use the model's own forward on
padded batches. The embeddings, LayerNorms, activations, pooler, classifier and MLM head are the
model's own modules; only the batching and the attention arithmetic are re-written. `build` checks
the result against the model's own forward on probe rows and returns None, with the reason, when
they differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

PROBE_TEXTS = ("a short probe", "a somewhat longer probe sentence , to check the packed forward pass")
PROBE_PAIR = ("the first part", "and a second one")
PROBE_ATOL = 1e-4


def unsupported(model, kind=None, needs_pooler: bool = True) -> Optional[str]:
    """Why `model` has no packed path, or None when it has one; `kind`: the class it must be
    (default BertForSequenceClassification)."""
    import torch
    from transformers import BertForSequenceClassification

    if kind is None:
        # A head-pruned BERT (transferset.pruning) has the same modules, narrower per layer: the packed
        # layers read each layer's head count from its own attention module, and the probe checks it.
        from transferset.pruning import pruned_classes

        kinds = (BertForSequenceClassification, pruned_classes()[1])
    else:
        kinds = (kind,)
    if type(model) not in kinds:
        return f"{type(model).__name__} is not {kinds[0].__name__}"
    config = model.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder BERT (causal or cross attention)"
    if needs_pooler and model.bert.pooler is None:
        return "the model has no pooler"
    odd = sorted({type(m).__name__ for m in model.modules()
                  if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear})
    if odd:
        return f"its linear layers are {', '.join(odd)} (quantized or wrapped)"
    return None


def onednn_linear_available(device) -> bool:
    """Whether torch's oneDNN linear (bias and activation fused into the matmul) can run here."""
    import torch

    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


class Linear:
    """y = act(x @ weight.T + bias): one oneDNN call with the bias and GELU fused when `onednn`
    (weights reordered once into oneDNN's layout), else torch.addmm followed by the activation."""

    def __init__(self, weight, bias, activation: Optional[Callable] = None, *, onednn: bool = False,
                 rows_hint: Optional[int] = None):
        import torch

        self.weight, self.bias, self.activation = weight, bias, activation
        fused = fused_activation(activation)
        self.onednn = onednn and fused is not None and weight.dtype == bias.dtype == torch.float32
        self.attr, self.algorithm = fused if self.onednn else ("none", "")
        if self.onednn:
            # Measured 3-6 % faster than the plain layout on MiniLM's shapes (2 cores), same results;
            # rows_hint: the typical rows (tokens) per call.
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)

    def __call__(self, x):
        import torch

        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.attr, [], self.algorithm)
        y = torch.addmm(self.bias, x, self.weight.t())
        return self.activation(y) if self.activation is not None else y


def fused_activation(activation) -> Optional[tuple[str, str]]:
    """oneDNN's (attr, algorithm) for an activation it can fuse; None for one it cannot."""
    import torch

    if activation is None:
        return "none", ""
    name = type(activation).__name__
    if name == "GELUActivation" and getattr(activation, "act", None) is torch.nn.functional.gelu:
        return "gelu", "none"  # the exact (erf) GELU of BERT's "gelu"
    if isinstance(activation, torch.nn.GELU):
        return "gelu", "tanh" if activation.approximate == "tanh" else "none"
    if isinstance(activation, torch.nn.ReLU):
        return "relu", ""
    return None


@dataclass(frozen=True)
class _Layer:
    qkv: Linear  # query, key and value weights stacked: one matmul for all three
    heads: int
    head_size: int
    attention_out: Linear
    attention_norm: Any  # the layer's own LayerNorm modules
    intermediate: Linear  # with the layer's activation
    out: Linear
    out_norm: Any


def groups_of_equal_length(lengths: np.ndarray, offsets: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive rows with the same length: (first token, rows, length) each."""
    if len(lengths) == 0:
        return []
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(lengths)) + 1, [len(lengths)]])
    return [(int(offsets[a]), int(b - a), int(lengths[a])) for a, b in zip(bounds[:-1], bounds[1:])]


def attention(q, k, v, scale: float):
    """(rows, heads, length, d) each -> (rows, heads, length, d); no mask, nothing is padded."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def layout(lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """(lengths, offsets, groups of equal length) of rows laid end to end."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return lengths, offsets, groups_of_equal_length(lengths, offsets)


class PackedEncoder:
    """The embeddings and layers of a `BertModel` (`model.bert`) run on rows packed end to end."""

    def __init__(self, bert, *, onednn: bool = False, rows_hint: Optional[int] = None):
        import torch

        self.embeddings = bert.embeddings
        self.layers = []

        def linear(module, activation=None):
            return Linear(module.weight.detach(), module.bias.detach(), activation, onednn=onednn, rows_hint=rows_hint)

        with torch.no_grad():
            for layer in bert.encoder.layer:
                sa = layer.attention.self
                qkv = Linear(torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).detach(),
                             torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]).detach(), onednn=onednn,
                             rows_hint=rows_hint)
                self.layers.append(_Layer(
                    qkv=qkv, heads=int(sa.num_attention_heads), head_size=int(sa.attention_head_size),
                    attention_out=linear(layer.attention.output.dense), attention_norm=layer.attention.output.LayerNorm,
                    intermediate=linear(layer.intermediate.dense, layer.intermediate.intermediate_act_fn),
                    out=linear(layer.output.dense), out_norm=layer.output.LayerNorm,
                ))
        self.kernels = "onednn" if any(lin.onednn for lay in self.layers for lin in (lay.qkv, lay.intermediate)) \
            else "aten"

    @classmethod
    def _build(cls, model, probe: Callable[["PackedEncoder"], float], atol: float, **kwargs):
        """(instance, "") when `probe(instance)` (the largest difference from the model's own forward) is
        within `atol`, oneDNN's fused linear tried first where available, then addmm; else (None, why)."""
        why = []
        device = next(model.parameters()).device
        for onednn in ([True, False] if onednn_linear_available(device) else [False]):
            kernels = "onednn" if onednn else "aten"
            try:
                packed = cls(model, onednn=onednn, **kwargs)
                worst = probe(packed)
            except Exception as exc:  # any failure here means: try the next kernels, then the model's own forward
                why.append(f"the probe forward ({kernels}) failed: {type(exc).__name__}: {exc}")
                continue
            if worst <= atol:
                return packed, ""
            why.append(f"probe logits ({kernels}) differ from the model's own forward by {worst:.2e} (> {atol})")
        return None, "; ".join(why)

    @property
    def device(self):
        return self.embeddings.word_embeddings.weight.device

    def states(self, input_ids, token_type_ids, lengths: np.ndarray, offsets: np.ndarray, groups):
        """Yields (k, (T, H) hidden states) for k = 0 (embeddings), 1 .. L (each layer's output).

        input_ids, token_type_ids: (T,) for rows laid end to end (`layout(lengths)`). Rows of equal
        length should be adjacent (sorted rows are): each run of them is one attention call.
        """
        import torch

        positions = torch.from_numpy(np.arange(int(lengths.sum())) - np.repeat(offsets, lengths)).to(self.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        emb = self.embeddings
        x = emb.word_embeddings(input_ids) + emb.token_type_embeddings(token_type_ids)
        x = emb.LayerNorm(x + emb.position_embeddings(positions))  # (T, H), the order BertEmbeddings adds in
        yield 0, x
        for k, layer in enumerate(self.layers, start=1):
            x = self.layer(layer, x, groups)
            yield k, x

    @staticmethod
    def layer(layer: _Layer, x, groups):
        import torch

        qkv = layer.qkv(x)  # (T, 3H)
        context = x.new_empty(x.shape[0], layer.heads * layer.head_size)  # narrower than x in a head-pruned layer
        scale = layer.head_size ** -0.5
        for start, rows, length in groups:
            end = start + rows * length
            q, k, v = qkv[start:end].view(rows, length, 3, layer.heads, layer.head_size).permute(2, 0, 3, 1, 4)
            out = attention(q, k, v, scale)  # (rows, heads, length, d)
            context[start:end].view(rows, length, layer.heads, layer.head_size).copy_(out.transpose(1, 2))
        x = layer.attention_norm(layer.attention_out(context).add_(x))
        return layer.out_norm(layer.out(layer.intermediate(x)).add_(x))


class PackedBert(PackedEncoder):
    """`forward(input_ids, token_type_ids, lengths, layers, pooling)` on rows packed end to end."""

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        super().__init__(model.bert, onednn=onednn, rows_hint=rows_hint)
        self.pooler = model.bert.pooler
        self.classifier = model.classifier  # dropout before it is a no-op in eval

    @classmethod
    def build(cls, model, tokenizer, rows_hint: Optional[int] = None) -> tuple[Optional["PackedBert"], str]:
        """(PackedBert, "") when the model has a packed path that matches its own forward, else (None, why).

        oneDNN's fused linear is tried first where available, then plain addmm.
        """
        reason = unsupported(model)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), PROBE_ATOL,
                          rows_hint=rows_hint)

    def probe_difference(self, model, tokenizer) -> float:
        """Largest |logit| difference between this path and model(**row) on a few probe rows."""
        import torch

        rows = [tokenizer(t) for t in PROBE_TEXTS] + [tokenizer(*PROBE_PAIR)]
        worst = 0.0
        with torch.inference_mode():
            logits, _ = self.score(rows, layers=(), pooling="cls")
            for i, row in enumerate(rows):
                alone = {k: torch.tensor([v], device=self.device) for k, v in row.items()}
                own = model(**alone).logits[0]
                worst = max(worst, float((own - logits[i]).abs().max()))
        return worst

    def score(self, features: Sequence[dict], layers: Sequence[int], pooling: str):
        """Tokenized rows (dicts with input_ids, maybe token_type_ids) -> `forward` on them packed."""
        ids, types = pack([f["input_ids"] for f in features], [f.get("token_type_ids") for f in features],
                          self.device)
        return self.forward(ids, types, [len(f["input_ids"]) for f in features], layers, pooling)

    def forward(self, input_ids, token_type_ids, lengths: Sequence[int], layers: Sequence[int], pooling: str):
        """input_ids, token_type_ids: (T,) for rows laid end to end, `lengths` tokens each.

        Returns logits (rows, C) and {layer: (rows, H)} pooled hidden states for `layers`
        (hidden_states indices: 0 = embeddings). Rows of equal length should be adjacent (sorted
        rows are): each run of them is one attention call.
        """
        import torch

        lengths, offsets, groups = layout(lengths)
        firsts = torch.from_numpy(offsets).to(self.device)
        pooled = {}
        for k, x in self.states(input_ids, token_type_ids, lengths, offsets, groups):
            if k in layers:
                pooled[k] = self.pool(x, groups, firsts, pooling)
        cls = x.index_select(0, firsts)  # (rows, H): each row's first token, [CLS]
        logits = self.classifier(self.pooler(cls.unsqueeze(1)))
        return logits, pooled

    @staticmethod
    def pool(x, groups, firsts, pooling: str):
        """(T, H) packed hidden states -> (rows, H): [CLS] or the mean over each row's tokens."""
        import torch

        if pooling == "cls":
            return x.index_select(0, firsts)
        return torch.cat([x[start:start + rows * length].view(rows, length, -1).mean(dim=1)
                          for start, rows, length in groups])


class PackedMaskedLM(PackedEncoder):
    """A `BertForMaskedLM`'s encoder on rows packed end to end, its vocabulary head on chosen tokens only
    (the MLM candidates of the tinybert recipe: one masked token per row)."""

    PROBE = ("a [MASK] probe sentence", "a short probe sentence")

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        super().__init__(model.bert, onednn=onednn, rows_hint=rows_hint)
        self.head = model.cls

    @classmethod
    def build(cls, model, tokenizer) -> tuple[Optional["PackedMaskedLM"], str]:
        from transformers import BertForMaskedLM

        reason = unsupported(model, BertForMaskedLM, needs_pooler=False)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), PROBE_ATOL)

    def probe_difference(self, model, tokenizer) -> float:
        """Largest |logit| difference from model(**row) at the first, the masked and the last token of a
        probe pair, relative to the largest logit (at least 1): vocabulary logits run larger than a
        classifier's."""
        import torch

        row = tokenizer(*self.PROBE)
        ids = row["input_ids"]
        at = [0, ids.index(tokenizer.mask_token_id) if tokenizer.mask_token_id in ids else 1, len(ids) - 1]
        with torch.inference_mode():
            packed = self.logits_at([row] * len(at), at)
            own = model(**{k: torch.tensor([v], device=self.device) for k, v in row.items()}).logits[0]
            expect = own[at]
            scale = max(1.0, float(expect.abs().max()))
            return float((packed - expect).abs().max()) / scale

    def logits_at(self, features: Sequence[dict], positions: Sequence[int]):
        """(rows, V): the vocabulary logits at token `positions[i]` of row i (rows of equal length adjacent)."""
        import torch

        ids, types = pack([f["input_ids"] for f in features], [f.get("token_type_ids") for f in features],
                          self.device)
        lengths, offsets, groups = layout([len(f["input_ids"]) for f in features])
        for _, x in self.states(ids, types, lengths, offsets, groups):
            pass
        at = torch.from_numpy(offsets + np.asarray(positions, dtype=np.int64)).to(self.device)
        return self.head(x.index_select(0, at))


def pack(input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Optional[Sequence[int]]], device):
    """Token-id lists -> (T,) tensors laid end to end; token types None when no row has them."""
    import torch

    ids = torch.from_numpy(np.fromiter((t for row in input_ids for t in row), dtype=np.int64))
    types = None
    if any(t is not None for t in token_type_ids):
        flat = (t for row, tt in zip(input_ids, token_type_ids) for t in (tt if tt is not None else [0] * len(row)))
        types = torch.from_numpy(np.fromiter(flat, dtype=np.int64)).to(device)
    return ids.to(device), types
