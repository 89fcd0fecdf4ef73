"""The BiLSTM student's forward pass as one exportable ONNX graph (students/compress/export.py exports it; the BiLSTM's
family, students/families/bilstm.py, names it as its export graph). No import of the model's module: it reads the
model's submodules (embeddings, lstm, head, classifier) and config, so the family can name it without a cycle.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def _onnx_gates(w: torch.Tensor) -> torch.Tensor:
    """PyTorch's LSTM gate blocks (input, forget, cell, output) in ONNX's order (input, output, forget, cell)."""
    i, f, c, o = w.chunk(4, 0)
    return torch.cat([i, o, f, c], 0)


def _torch_gates(w: torch.Tensor) -> torch.Tensor:
    """The inverse of _onnx_gates."""
    i, o, f, c = w.chunk(4, 0)
    return torch.cat([i, f, c, o], 0)


class _LSTMWithLengths(torch.autograd.Function):
    """One bidirectional LSTM layer over right-padded rows, exported as one ONNX LSTM with sequence_lens.

    ONNX's LSTM takes each row's length and runs both directions within it (the backward one from the
    row's last real token), its outputs past a row's length 0: rows need not be sorted or packed, so the
    graph has no TopK/ScatterElements around the LSTM as PyTorch's packed-sequence export has (a fifth
    of the BiLSTM's time at batch 1). Traced as one node: `forward` gives the tracer the layer's values
    (PyTorch's LSTM over packed rows, on the same weights), `symbolic` the ONNX it exports as.
    """

    @staticmethod
    def forward(ctx, x, lengths, w, r, b):
        out, _ = _packed_lstm(x, lengths, w, r, b)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=int(x.shape[1]))
        return out                                                                      # (B, T, 2H)

    @staticmethod
    def symbolic(g, x, lengths, w, r, b):
        y = _onnx_lstm(g, x, lengths, w, r, b)[0]                                       # (T, 2, B, H)
        y = g.op("Transpose", y, perm_i=[2, 0, 1, 3])                                   # (B, T, 2, H)
        shape = g.op("Constant", value_t=torch.tensor([0, 0, -1], dtype=torch.int64))
        return g.op("Reshape", y, shape)                                                # (B, T, 2H)


class _LSTMLastStates(torch.autograd.Function):
    """The top layer of a `pool: last` BiLSTM: each direction's final state, (B, 2H), exported as the ONNX
    LSTM's Y_h output (the forward state at each row's last real token, the backward one at its first).

    The model reads nothing else of that layer, so the graph needs no per-step output, transposed, masked
    and gathered: the same logits, ~4 % less time at batch 1 (the demo's distilled BiLSTM, SST-2 dev).
    """

    @staticmethod
    def forward(ctx, x, lengths, w, r, b):
        _, (h, _) = _packed_lstm(x, lengths, w, r, b)                                   # (2, B, H), rows in order
        return torch.cat([h[0], h[1]], dim=-1)                                          # (B, 2H)

    @staticmethod
    def symbolic(g, x, lengths, w, r, b):
        h = _onnx_lstm(g, x, lengths, w, r, b)[1]                                       # (2, B, H)
        h = g.op("Transpose", h, perm_i=[1, 0, 2])                                      # (B, 2, H)
        shape = g.op("Constant", value_t=torch.tensor([0, -1], dtype=torch.int64))
        return g.op("Reshape", h, shape)                                                # (B, 2H)


def _packed_lstm(x, lengths, w, r, b):
    """PyTorch's bidirectional LSTM on ONNX-ordered weights over right-padded rows: (packed output, (h, c))."""
    four = int(r.shape[1])  # under the tracer shapes are tensors
    lstm = nn.LSTM(int(x.shape[-1]), int(r.shape[-1]), batch_first=True, bidirectional=True)
    state = {}
    for d, suffix in enumerate(("_l0", "_l0_reverse")):
        state.update({"weight_ih" + suffix: _torch_gates(w[d]), "weight_hh" + suffix: _torch_gates(r[d]),
                      "bias_ih" + suffix: _torch_gates(b[d, :four]), "bias_hh" + suffix: _torch_gates(b[d, four:])})
    lstm.load_state_dict(state)
    return lstm(pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False))


def _onnx_lstm(g, x, lengths, w, r, b):
    """One bidirectional ONNX LSTM over (B, T, I) rows of the given lengths: its outputs Y, Y_h, Y_c."""
    xt = g.op("Transpose", x, perm_i=[1, 0, 2])                                         # (T, B, I)
    lens = g.op("Cast", lengths, to_i=6)                                                # int32
    return g.op("LSTM", xt, w, r, b, lens, direction_s="bidirectional", hidden_size_i=r.type().sizes()[-1],
                outputs=3)


class BiLSTMGraph(nn.Module):
    """The BiLSTM student's forward pass as one exportable graph, on the student's own weights.

    Each layer is one bidirectional ONNX LSTM with the rows' lengths (_LSTMWithLengths), its weights
    reordered into ONNX's gate order here. A trimmed vocabulary's remapping (WordPiece id → student row)
    is inside the graph, so it takes the tokenizer's ids as they are.
    """

    def __init__(self, model: nn.Module, remap: Optional[torch.Tensor]):
        super().__init__()
        self.model = model
        self.register_buffer("remap", remap.clone() if remap is not None else None)
        lstm, cfg = model.lstm, model.config
        for layer in range(cfg.layers):
            names = [f"_l{layer}", f"_l{layer}_reverse"]
            # ONNX's: W (2, 4H, I), R (2, 4H, H), B (2, 8H) = input then recurrent biases, per direction
            w = torch.stack([_onnx_gates(getattr(lstm, "weight_ih" + n)) for n in names])
            r = torch.stack([_onnx_gates(getattr(lstm, "weight_hh" + n)) for n in names])
            b = torch.stack([torch.cat([_onnx_gates(getattr(lstm, "bias_ih" + n)),
                                        _onnx_gates(getattr(lstm, "bias_hh" + n))]) for n in names])
            self.register_buffer(f"w{layer}", w.detach().clone())
            self.register_buffer(f"r{layer}", r.detach().clone())
            self.register_buffer(f"b{layer}", b.detach().clone())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m, cfg = self.model, self.model.config
        ids = self.remap[input_ids] if self.remap is not None else input_ids            # (B, T)
        T = ids.shape[1]
        lengths = (attention_mask != 0).sum(1).clamp(min=1)                              # (B,)
        x = m.embed(ids)                                                                 # (B, T, E)
        for layer in range(cfg.layers):                                                  # no dropout: eval
            # `pool: last` reads only the top layer's final states: forward at each row's last token,
            # backward at position 0.
            top_last = layer == cfg.layers - 1 and cfg.pool != "max"
            x = (_LSTMLastStates if top_last else _LSTMWithLengths).apply(
                x, lengths, getattr(self, f"w{layer}"), getattr(self, f"r{layer}"), getattr(self, f"b{layer}"))
        if cfg.pool == "max":                                                            # x: (B, T, 2H)
            valid = torch.arange(T, device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
            # The exported padding is 0, not -inf: mask it as the model does.
            pooled = x.masked_fill(~valid.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H)
        else:
            pooled = x                                                                   # (B, 2H)
        z = m.head(pooled)                                                               # (B, D)
        rep = F.gelu(z) if cfg.head_act == "gelu" else F.relu(z)
        return m.classifier(rep)                                                         # (B, C)
