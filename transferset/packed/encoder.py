"""An encoder's embeddings and layers run on rows packed end to end: the post-norm layer most families share
(`PackedEncoder.layer`) and ModernBERT's pre-norm one (`PackedEncoder.prenorm_layer`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from transferset.packed.biases import _DisentangledBias, _MPNetBias
from transferset.packed.kernels import Linear, attention, onednn_linear_available


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
