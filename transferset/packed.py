"""Padding-free forward pass for encoder classifiers: every matmul runs on real tokens only.

A padded batch spends FLOPs on pad tokens. Sorting rows by length (scoring.Teacher) cuts that
waste but still leaves ~15 % on SST-2 and keeps forward batches small. Here the rows of a forward
batch are packed into one (tokens, hidden) matrix: the linear layers, nearly all of the FLOPs, run
once over the packed tokens (query, key and value as one matmul), and attention runs per group of
rows of equal length, so there is no padding and no attention mask anywhere.

One generic path serves the encoder families people fine-tune, which share the post-norm layer
(attention, add & norm, feed-forward, add & norm) and differ in names and in a few places:
- BERT: word + token type + absolute position embeddings; pooler then classifier.
- RoBERTa / XLM-R / CamemBERT: BERT's layers; position ids start at padding_idx + 1; the head takes <s>.
- ELECTRA: BERT's layers; embeddings_project when embedding_size differs from hidden_size.
- DistilBERT: other module names, no token types; pre_classifier + ReLU + classifier.
- MPNet: relative position bias (the same per length for all layers) added to the scores.
- DeBERTa-v2/v3: disentangled attention (content-to-position and position-to-content scores, per
  layer, from q and k), computed per group of equal length with the position projections done once.
- ModernBERT (a pre-norm layer of its own, `prenorm_layer`): rotary positions per row, gated GELU,
  a band mask on its local-attention layers for rows longer than the window, the final norm; cls or
  mean pooling before its head.
The classes served are CLASSIFIERS and MASKED_LMS (the tinybert recipe's MLM candidates:
PackedMaskedLM, the vocabulary head on the masked tokens only); anything else (DeBERTa v1, the MLMs
of DeBERTa-v2 and ModernBERT, a subclass, remote code, quantized linears) uses the model's own forward on padded batches,
with the reason (NOT_SERVED, `unsupported`). The embeddings, LayerNorms, activations, pooler,
classifier and MLM head are the model's own modules; only the batching and the attention arithmetic
are re-written. `build` checks the result against the model's own forward on probe rows and returns
None, with the reason, when they differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

PROBE_TEXTS = ("a short probe", "a somewhat longer probe sentence , to check the packed forward pass")
PROBE_PAIR = ("the first part", "and a second one")
PROBE_ATOL = 1e-4


# The classes served padding-free, by family. A family is one embedding recipe and one layer layout;
# the classifier and MLM heads are the model's own modules. Encoder module names differ per family
# (bert, roberta, ...), hence the attribute of the base model alongside.
FAMILY_BASE = {"bert": "bert", "roberta": "roberta", "electra": "electra", "distilbert": "distilbert",
               "mpnet": "mpnet", "deberta-v2": "deberta", "modernbert": "model"}
CLASSIFIERS = {
    "BertForSequenceClassification": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForSequenceClassification": "roberta",
    "CamembertForSequenceClassification": "roberta",
    "ElectraForSequenceClassification": "electra",
    "DistilBertForSequenceClassification": "distilbert",
    "MPNetForSequenceClassification": "mpnet",
    "DebertaV2ForSequenceClassification": "deberta-v2",
    "ModernBertForSequenceClassification": "modernbert",
}
MASKED_LMS = {
    "BertForMaskedLM": "bert",
    "RobertaForMaskedLM": "roberta",
    "XLMRobertaForMaskedLM": "roberta",
    "CamembertForMaskedLM": "roberta",
    "ElectraForMaskedLM": "electra",
    "DistilBertForMaskedLM": "distilbert",
    "MPNetForMaskedLM": "mpnet",
}
PRUNED_BERT = ("transferset.pruning", "PrunedBertForSequenceClassification")
# Families people fine-tune that take the padded path, and why (the log says it).
NOT_SERVED = {
    "ModernBertForMaskedLM": "ModernBERT's MLM (its head and sparse prediction) has no packed path yet",
    "DebertaV2ForMaskedLM": "DeBERTa-v2's MLM head (tied to the embeddings, two head layouts) has no packed path yet",
    "DebertaFor": "DeBERTa v1 (a different disentangled attention) has no packed path",
}


def family_of(model, served: Optional[dict] = None) -> Optional[str]:
    """The family of `model` when its class is served (`served`: CLASSIFIERS by default), else None.
    A subclass or a remote-code class with the same name is not served: its forward may differ."""
    name = type(model).__name__
    served = CLASSIFIERS if served is None else served
    if served is CLASSIFIERS and (type(model).__module__, name) == PRUNED_BERT:
        # a head-pruned BERT (transferset.pruning): BERT's modules, narrower per layer; each packed layer
        # reads its head count from its own attention module, and the probe checks it
        return "bert"
    if name not in served or not type(model).__module__.startswith("transformers.models."):
        return None
    return served[name]


def unsupported(model, kind=None, needs_pooler: bool = True) -> Optional[str]:
    """Why `model` has no packed path, or None when it has one. `kind`: the classes served, CLASSIFIERS
    (default) or MASKED_LMS."""
    import torch

    served = kind or CLASSIFIERS
    family = family_of(model, served)
    if family is None:
        name = type(model).__name__
        known = next((why for key, why in NOT_SERVED.items() if name.startswith(key)), None)
        return (f"{name}: {known}" if known else
                f"{name} is not served padding-free (served: {', '.join(sorted(served))})")
    config = model.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder (causal or cross attention)"
    base = getattr(model, FAMILY_BASE[family])
    if family == "bert" and needs_pooler and base.pooler is None:
        return "the model has no pooler"
    if family == "deberta-v2" and getattr(base.encoder, "conv", None) is not None:
        return "a DeBERTa-v2 with a convolution after its first layer (conv_kernel_size) has no packed path"
    if family == "modernbert" and config.classifier_pooling not in ("cls", "mean"):
        return f"ModernBERT's classifier_pooling {config.classifier_pooling!r} has no packed path"
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
    scale: float  # of q·k (DeBERTa divides by more than √d)
    # (q, k, length) -> an additive (rows or 1, heads, L, L) score bias: relative positions (MPNet, DeBERTa)
    bias: Optional[Callable] = None


@dataclass(frozen=True)
class _PreNormLayer:
    """A ModernBERT layer: pre-norm, rotary positions, gated GELU, global or local (windowed) attention."""
    attention_norm: Any  # Identity in the first layer
    qkv: Linear
    heads: int
    head_size: int
    attention_out: Linear
    mlp_norm: Any
    mlp_in: Linear  # input and gate stacked
    activation: Any
    mlp_out: Linear
    kind: str  # full_attention or sliding_attention: the rotary table it uses, and whether it has a window
    window: Optional[int]  # a token sees the tokens at most this far away (None: all)


def groups_of_equal_length(lengths: np.ndarray, offsets: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive rows with the same length: (first token, rows, length) each."""
    if len(lengths) == 0:
        return []
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(lengths)) + 1, [len(lengths)]])
    return [(int(offsets[a]), int(b - a), int(lengths[a])) for a, b in zip(bounds[:-1], bounds[1:])]


def attention(q, k, v, scale: float, bias=None):
    """(rows, heads, length, d) each -> (rows, heads, length, d); nothing is padded, so no mask: only
    a family's relative-position `bias` (added to the scores) where it has one."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def layout(lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """(lengths, offsets, groups of equal length) of rows laid end to end."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return lengths, offsets, groups_of_equal_length(lengths, offsets)


class _MPNetBias:
    """MPNet's relative position bias: the same (1, heads, L, L) for every row of length L and every
    layer, computed once per length by the encoder's own bucketing."""

    def __init__(self, encoder):
        self.encoder, self.cache = encoder, {}

    def __call__(self, q, k, length: int):
        bias = self.cache.get(length)
        if bias is None:
            probe = q.new_zeros(1, length, 1)
            bias = self.cache[length] = self.encoder.compute_position_bias(probe).to(q.dtype)  # (1, heads, L, L)
        return bias


class _DisentangledBias:
    """DeBERTa-v2/v3's content-to-position and position-to-content scores of one layer, on rows of
    equal length. The position projections of the relative embeddings depend on the weights only,
    so they are computed once here instead of in every forward pass (the model's own forward
    re-projects 2 × 256 relative embeddings per layer per call)."""

    def __init__(self, sa, rel_embeddings, position_buckets: int, max_relative_positions: int, scale: float):
        span = sa.pos_ebd_size
        rel = rel_embeddings[:span * 2]  # (2S, H)
        heads, d = sa.num_attention_heads, sa.attention_head_size

        def per_head(linear):  # (2S, H) -> (heads, 2S, d)
            return linear(rel).view(2 * span, heads, d).transpose(0, 1).contiguous()

        kinds = sa.pos_att_type
        self.pos_key = per_head(sa.key_proj if sa.share_att_key else sa.pos_key_proj) if "c2p" in kinds else None
        self.pos_query = per_head(sa.query_proj if sa.share_att_key else sa.pos_query_proj) \
            if "p2c" in kinds else None
        self.span, self.buckets, self.max_positions, self.scale = span, position_buckets, max_relative_positions, scale
        self.cache: dict = {}

    def _index(self, length: int, device):
        """For rows of `length`: (c2p, p2c), each (first, width, (L, L) index): the model's own relative
        position indices into the 2S embeddings, less `first`, the lowest of them. Only the `width` embeddings
        from `first` on (at most 2L - 1 of the 2S) can score, so only they are multiplied."""
        import torch
        from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

        index = self.cache.get(length)
        if index is None:
            probe = torch.zeros(1, length, 1, device=device)
            rel = build_relative_position(probe, probe, bucket_size=self.buckets, max_position=self.max_positions)[0]
            last = 2 * self.span - 1
            index = self.cache[length] = tuple(self._window(i) for i in (torch.clamp(rel + self.span, 0, last),
                                                                         torch.clamp(-rel + self.span, 0, last)))
        return index

    @staticmethod
    def _window(index) -> tuple:
        """(first, width, index - first) of an (L, L) index: computed once per length, not per call."""
        first = int(index.min())
        return first, int(index.max()) - first + 1, (index - first).contiguous()

    @staticmethod
    def _scores(x, table, window: tuple):
        """out[r, h, a, b] = x[r, h, a] · table[h, first + index[a, b]]: one matmul against the embeddings
        in reach, then a gather (the model's own forward does the same against all 2S of them)."""
        import torch

        first, width, index = window
        scores = torch.matmul(x, table[:, first:first + width].transpose(-1, -2))  # (rows, heads, L, width)
        return torch.gather(scores, -1, index.expand(x.shape[0], x.shape[1], -1, -1))

    def __call__(self, q, k, length: int):
        c2p, p2c = self._index(length, q.device)
        bias = None
        if self.pos_key is not None:  # q_i · K_pos[c2p(i, j)]
            bias = self._scores(q, self.pos_key, c2p)
        if self.pos_query is not None:  # k_j · Q_pos[p2c(j, i)], laid out as (i, j)
            term = self._scores(k, self.pos_query, p2c).transpose(-1, -2)
            bias = term if bias is None else bias.add_(term)
        return None if bias is None else bias.mul_(self.scale)


def _modules_of(family: str, layer) -> dict:
    """The layer's modules under one set of names: q, k, v, attention out and its norm, FFN in/act/out, norm."""
    if family == "distilbert":
        sa = layer.attention
        return dict(q=sa.q_lin, k=sa.k_lin, v=sa.v_lin, heads=sa.n_heads, head_size=sa.attention_head_size,
                    o=sa.out_lin, o_norm=layer.sa_layer_norm, ffn_in=layer.ffn.lin1, act=layer.ffn.activation,
                    ffn_out=layer.ffn.lin2, out_norm=layer.output_layer_norm)
    if family == "mpnet":
        sa = layer.attention.attn
        return dict(q=sa.q, k=sa.k, v=sa.v, heads=sa.num_attention_heads, head_size=sa.attention_head_size,
                    o=sa.o, o_norm=layer.attention.LayerNorm, ffn_in=layer.intermediate.dense,
                    act=layer.intermediate.intermediate_act_fn, ffn_out=layer.output.dense,
                    out_norm=layer.output.LayerNorm)
    sa = layer.attention.self  # BERT's layout: BERT, RoBERTa/XLM-R/CamemBERT, ELECTRA, DeBERTa-v2
    names = ("query_proj", "key_proj", "value_proj") if family == "deberta-v2" else ("query", "key", "value")
    q, k, v = (getattr(sa, n) for n in names)
    return dict(q=q, k=k, v=v, heads=sa.num_attention_heads, head_size=sa.attention_head_size,
                o=layer.attention.output.dense, o_norm=layer.attention.output.LayerNorm,
                ffn_in=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn,
                ffn_out=layer.output.dense, out_norm=layer.output.LayerNorm)


class PackedEncoder:
    """The embeddings and layers of an encoder (`model.bert`, `model.roberta`, ...) run on rows packed end to end."""

    def __init__(self, base, family: str = "bert", *, onednn: bool = False, rows_hint: Optional[int] = None):
        import torch

        self.family = family
        self.base = base
        self.embeddings = base.embeddings
        # RoBERTa-style position ids count from padding_idx + 1 (create_position_ids_from_input_ids).
        self.position_offset = (int(self.embeddings.padding_idx) + 1) if family in ("roberta", "mpnet") else 0
        self.layers = []

        def linear(module, activation=None):
            bias = module.bias if module.bias is not None else module.weight.new_zeros(module.weight.shape[0])
            return Linear(module.weight.detach(), bias.detach(), activation, onednn=onednn, rows_hint=rows_hint)

        if family == "modernbert":
            self._modernbert_layers(base, linear)
            return
        with torch.no_grad():
            encoder = base.transformer if family == "distilbert" else base.encoder
            relative = None
            if family == "deberta-v2" and encoder.relative_attention:
                relative = encoder.get_rel_embedding().detach()
            for layer in encoder.layer:
                m = _modules_of(family, layer)
                biases = [x.bias if x.bias is not None else x.weight.new_zeros(x.weight.shape[0])
                          for x in (m["q"], m["k"], m["v"])]
                qkv = Linear(torch.cat([m["q"].weight, m["k"].weight, m["v"].weight]).detach(),
                             torch.cat(biases).detach(), onednn=onednn, rows_hint=rows_hint)
                scale, bias = int(m["head_size"]) ** -0.5, None
                if family == "mpnet":
                    bias = _MPNetBias(encoder)
                elif family == "deberta-v2":
                    sa = layer.attention.self
                    factor = 1 + ("c2p" in sa.pos_att_type) + ("p2c" in sa.pos_att_type)
                    scale = (int(m["head_size"]) * factor) ** -0.5
                    if sa.relative_attention:
                        bias = _DisentangledBias(sa, relative, encoder.position_buckets,
                                                 encoder.max_relative_positions, scale)
                self.layers.append(_Layer(
                    qkv=qkv, heads=int(m["heads"]), head_size=int(m["head_size"]),
                    attention_out=linear(m["o"]), attention_norm=m["o_norm"],
                    intermediate=linear(m["ffn_in"], m["act"]), out=linear(m["ffn_out"]), out_norm=m["out_norm"],
                    scale=scale, bias=bias,
                ))
        self.kernels = "onednn" if any(lin.onednn for lay in self.layers for lin in (lay.qkv, lay.intermediate)) \
            else "aten"

    def _modernbert_layers(self, base, linear) -> None:
        config = base.config
        self.position_offset = 0
        self.bands: dict = {}
        for layer in base.layers:
            attn = layer.attn
            local = layer.attention_type == "sliding_attention"
            self.layers.append(_PreNormLayer(
                attention_norm=layer.attn_norm, qkv=linear(attn.Wqkv), heads=int(config.num_attention_heads),
                head_size=int(attn.head_dim), attention_out=linear(attn.Wo), mlp_norm=layer.mlp_norm,
                mlp_in=linear(layer.mlp.Wi), activation=layer.mlp.act, mlp_out=linear(layer.mlp.Wo),
                kind=layer.attention_type, window=int(config.sliding_window) if local else None))
        self.kernels = "onednn" if any(lay.qkv.onednn for lay in self.layers) else "aten"

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
        return next(self.embeddings.parameters()).device

    def inputs(self, row: dict) -> dict:
        """The keys of a tokenized row the model's own forward takes (DistilBERT and MPNet: no token types)."""
        keys = ("input_ids",) if self.family in ("distilbert", "mpnet", "modernbert") \
            else ("input_ids", "token_type_ids")
        return {k: row[k] for k in keys if k in row}

    def embed(self, input_ids, token_type_ids, positions):
        """(T,) ids -> (T, H) embeddings, adding in the order of the family's own embeddings module."""
        import torch

        emb, family = self.embeddings, self.family
        if family == "modernbert":
            return emb.norm(emb.tok_embeddings(input_ids))
        x = emb.word_embeddings(input_ids)
        if family in ("bert", "roberta", "electra"):
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = emb.LayerNorm(x + emb.token_type_embeddings(types) + emb.position_embeddings(positions))
            project = getattr(self.base, "embeddings_project", None)  # ELECTRA: embedding_size < hidden_size
            return project(x) if project is not None else x
        if family in ("distilbert", "mpnet"):  # no token types
            return emb.LayerNorm(x + emb.position_embeddings(positions))
        # deberta-v2: absolute positions and token types only where the config has them (v3 has neither)
        if emb.position_biased_input:
            x = x + emb.position_embeddings(positions)
        if emb.token_type_embeddings is not None:
            x = x + emb.token_type_embeddings(token_type_ids if token_type_ids is not None
                                              else torch.zeros_like(input_ids))
        if emb.embed_proj is not None:
            x = emb.embed_proj(x)
        return emb.LayerNorm(x)

    def states(self, input_ids, token_type_ids, lengths: np.ndarray, offsets: np.ndarray, groups):
        """Yields (k, (T, H) hidden states) for k = 0 (embeddings), 1 .. L (each layer's output).

        input_ids, token_type_ids: (T,) for rows laid end to end (`layout(lengths)`). Rows of equal
        length should be adjacent (sorted rows are): each run of them is one attention call.
        """
        import torch

        positions = np.arange(int(lengths.sum())) - np.repeat(offsets, lengths) + self.position_offset
        positions = torch.from_numpy(positions).to(self.device)
        x = self.embed(input_ids, token_type_ids, positions)
        yield 0, x
        if self.family == "modernbert":
            yield from self._prenorm_states(x, positions, groups)
            return
        for k, layer in enumerate(self.layers, start=1):
            x = self.layer(layer, x, groups)
            yield k, x

    @staticmethod
    def layer(layer: _Layer, x, groups):
        qkv = layer.qkv(x)  # (T, 3H')
        width = layer.heads * layer.head_size
        context = x.new_empty(x.shape[0], width)
        for start, rows, length in groups:
            end = start + rows * length
            q, k, v = qkv[start:end].view(rows, length, 3, layer.heads, layer.head_size).permute(2, 0, 3, 1, 4)
            if layer.bias is None:
                out = attention(q, k, v, layer.scale)  # (rows, heads, length, d)
            else:
                out = attention(q, k, v, layer.scale, layer.bias(q, k, length))
            context[start:end].view(rows, length, layer.heads, layer.head_size).copy_(out.transpose(1, 2))
        x = layer.attention_norm(layer.attention_out(context).add_(x))
        return layer.out_norm(layer.out(layer.intermediate(x)).add_(x))


    def _prenorm_states(self, x, positions, groups):
        """ModernBERT's layers on packed rows; the last state is after the final norm, as hidden_states has it."""
        rotary = {kind: self.base.rotary_emb(x, positions, kind) for kind in {lay.kind for lay in self.layers}}
        for k, layer in enumerate(self.layers, start=1):
            x = self.prenorm_layer(layer, x, groups, *rotary[layer.kind])
            yield k, (self.base.final_norm(x) if k == len(self.layers) else x)

    def _band(self, length: int, window: int, like):
        """(L, L) additive mask of a local layer: 0 within `window` tokens, -inf beyond."""
        import torch

        band = self.bands.get((length, window))
        if band is None:
            at = torch.arange(length, device=like.device)
            far = (at[:, None] - at[None, :]).abs() > window
            band = self.bands[(length, window)] = torch.zeros(length, length, dtype=like.dtype,
                                                              device=like.device).masked_fill_(far, float("-inf"))
        return band

    def prenorm_layer(self, layer: _PreNormLayer, x, groups, cos, sin):
        import torch

        heads, d = layer.heads, layer.head_size
        qkv = layer.qkv(layer.attention_norm(x)).view(-1, 3, heads, d)  # (T, 3, heads, d)
        q, k, v = qkv.unbind(dim=1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, d)

        def rotate(t):  # rotary positions, each token at its position within its own row
            half = t.shape[-1] // 2
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        q, k = rotate(q), rotate(k)
        context = x.new_empty(x.shape[0], heads * d)
        for start, rows, length in groups:
            end = start + rows * length
            qg, kg, vg = (t[start:end].view(rows, length, heads, d).transpose(1, 2) for t in (q, k, v))
            band = None
            if layer.window is not None and length - 1 > layer.window:
                band = self._band(length, layer.window, x)
            out = attention(qg, kg, vg, d ** -0.5) if band is None else attention(qg, kg, vg, d ** -0.5, band)
            context[start:end].view(rows, length, heads, d).copy_(out.transpose(1, 2))
        x = x + layer.attention_out(context)
        gate_in, gate = layer.mlp_in(layer.mlp_norm(x)).chunk(2, dim=-1)
        return x + layer.mlp_out(layer.activation(gate_in) * gate)


def probe_rows(model, tokenizer=None, texts: Sequence[str] = PROBE_TEXTS, pair=PROBE_PAIR) -> list[dict]:
    """Rows to check a packed path on: the tokenizer's encodings of the probe texts (real special
    tokens), or, without a tokenizer, seeded random ids of a few lengths (two of equal length: one
    attention call over two rows), with a second segment where the model has token types."""
    if tokenizer is not None:
        return [dict(tokenizer(t)) for t in texts] + [dict(tokenizer(*pair))]
    config = model.config
    rng = np.random.default_rng(0)
    pad = getattr(config, "pad_token_id", None)
    rows = []
    for n in (3, 9, 9, 17):
        ids = rng.integers(0, config.vocab_size, size=n)
        if pad is not None:
            ids[ids == pad] = (pad + 1) % config.vocab_size  # a pad id inside a row would shift RoBERTa's positions
        rows.append({"input_ids": ids.tolist()})
    if family_of(model, {**CLASSIFIERS, **MASKED_LMS}) in ("bert", "electra") \
            and getattr(config, "type_vocab_size", 1) > 1:
        for row in rows:
            n = len(row["input_ids"])
            row["token_type_ids"] = [0] * (n // 2) + [1] * (n - n // 2)
    return rows


class PackedClassifier(PackedEncoder):
    """`forward(input_ids, token_type_ids, lengths, layers, pooling)` on rows packed end to end, for the
    sequence classifiers of every family in CLASSIFIERS."""

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        family = CLASSIFIERS.get(type(model).__name__, "bert")
        super().__init__(getattr(model, FAMILY_BASE[family]), family, onednn=onednn, rows_hint=rows_hint)
        self.model = model

    @classmethod
    def build(cls, model, tokenizer=None, rows_hint: Optional[int] = None
              ) -> tuple[Optional["PackedClassifier"], str]:
        """(PackedClassifier, "") when the model has a packed path that matches its own forward, else
        (None, why). oneDNN's fused linear is tried first where available, then plain addmm."""
        reason = unsupported(model)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), PROBE_ATOL,
                          rows_hint=rows_hint)

    def probe_difference(self, model, tokenizer=None) -> float:
        """Largest |logit| difference between this path and model(**row) on a few probe rows."""
        import torch

        rows = probe_rows(model, tokenizer)
        worst = 0.0
        with torch.inference_mode():
            order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
            logits, _ = self.score([rows[i] for i in order], layers=(), pooling="cls")
            for at, i in enumerate(order):
                alone = {k: torch.tensor([v], device=self.device) for k, v in self.inputs(rows[i]).items()}
                own = model(**alone).logits[0]
                worst = max(worst, float((own - logits[at]).abs().max()))
        return worst

    def head(self, first):
        """(rows, H) hidden states of each row's first token -> (rows, C) logits, through the model's own
        head modules (dropout is a no-op in eval)."""
        model, family = self.model, self.family
        if family == "bert":
            return model.classifier(model.bert.pooler(first.unsqueeze(1)))
        if family == "distilbert":
            return model.classifier(model.pre_classifier(first).relu_())
        if family == "deberta-v2":
            return model.classifier(model.pooler(first.unsqueeze(1)))
        if family == "modernbert":  # `first` is the pooled state here (cls or mean, the config's pooling)
            return model.classifier(model.head(first))
        return model.classifier(first.unsqueeze(1))  # RoBERTa, ELECTRA, MPNet heads take (B, T, H), use [:, 0]

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
        if self.family == "modernbert" and self.model.config.classifier_pooling == "mean":
            return self.head(self.pool(x, groups, firsts, "mean")), pooled
        return self.head(x.index_select(0, firsts)), pooled  # each row's first token: [CLS] / <s>

    @staticmethod
    def pool(x, groups, firsts, pooling: str):
        """(T, H) packed hidden states -> (rows, H): [CLS] or the mean over each row's tokens."""
        import torch

        if pooling == "cls":
            return x.index_select(0, firsts)
        return torch.cat([x[start:start + rows * length].view(rows, length, -1).mean(dim=1)
                          for start, rows, length in groups])


PackedBert = PackedClassifier  # the name from when BERT was the only family


class PackedMaskedLM(PackedEncoder):
    """A masked LM's encoder (every family in MASKED_LMS) on rows packed end to end, its vocabulary head
    on chosen tokens only (the MLM candidates of the tinybert recipe: one masked token per row)."""

    PROBE = ("a {mask} probe sentence", "a short probe sentence")

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        family = MASKED_LMS.get(type(model).__name__, "bert")
        super().__init__(getattr(model, FAMILY_BASE[family]), family, onednn=onednn, rows_hint=rows_hint)
        self.model = model

    def head(self, x):
        """(N, H) -> (N, V) vocabulary logits, through the model's own head modules."""
        model, family = self.model, self.family
        if family == "bert":
            return model.cls(x)
        if family == "electra":
            return model.generator_lm_head(model.generator_predictions(x))
        if family == "distilbert":
            return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(x))))
        return model.lm_head(x)  # RoBERTa/XLM-R/CamemBERT, MPNet

    @classmethod
    def build(cls, model, tokenizer=None) -> tuple[Optional["PackedMaskedLM"], str]:
        reason = unsupported(model, MASKED_LMS, needs_pooler=False)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), PROBE_ATOL)

    def probe_difference(self, model, tokenizer=None) -> float:
        """Largest |logit| difference from model(**row) at the first, the masked and the last token of a
        probe pair, relative to the largest logit (at least 1): vocabulary logits run larger than a
        classifier's."""
        import torch

        if tokenizer is not None:
            masked, original = self.PROBE
            row = self.inputs(dict(tokenizer(masked.format(mask=tokenizer.mask_token), original)))
            ids = row["input_ids"]
            mask = tokenizer.mask_token_id
            at = [0, ids.index(mask) if mask in ids else 1, len(ids) - 1]
        else:
            row = probe_rows(model)[-1]
            at = [0, len(row["input_ids"]) // 2, len(row["input_ids"]) - 1]
        with torch.inference_mode():
            packed = self.logits_at([row] * len(at), at)
            own = model(**{k: torch.tensor([v], device=self.device) for k, v in self.inputs(row).items()}).logits[0]
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
