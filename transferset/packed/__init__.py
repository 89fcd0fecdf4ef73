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
The classes served are CLASSIFIERS and MASKED_LMS (families.py) (the tinybert recipe's MLM candidates:
PackedMaskedLM, the vocabulary head on the masked tokens only); anything else (DeBERTa v1, the MLMs
of DeBERTa-v2 and ModernBERT, a subclass, remote code, quantized linears) uses the model's own forward on padded batches,
with the reason (NOT_SERVED, `unsupported`). The embeddings, LayerNorms, activations, pooler,
classifier and MLM head are the model's own modules; only the batching and the attention arithmetic
are re-written. `build` checks the result against the model's own forward on probe rows and returns
None, with the reason, when they differ.

Modules: `families` (what is served, and why not; probe rows), `kernels` (linear, attention, layout),
`biases` (relative positions), `encoder` (embeddings and layers), `heads` (PackedClassifier, PackedMaskedLM).
"""
from __future__ import annotations

from transferset.packed.encoder import PackedEncoder
from transferset.packed.families import (CLASSIFIERS, FAMILY_BASE, MASKED_LMS, NOT_SERVED, PROBE_ATOL, PROBE_PAIR,
                                         PROBE_TEXTS, PRUNED_BERT, family_of, probe_rows, unsupported)
from transferset.packed.heads import PackedBert, PackedClassifier, PackedMaskedLM
from transferset.packed.kernels import (Linear, attention, fused_activation, groups_of_equal_length, layout,
                                        onednn_linear_available, pack)


__all__ = [
    "CLASSIFIERS", "FAMILY_BASE", "Linear", "MASKED_LMS", "NOT_SERVED", "PROBE_ATOL", "PROBE_PAIR", "PROBE_TEXTS",
    "PRUNED_BERT", "PackedBert", "PackedClassifier", "PackedEncoder", "PackedMaskedLM", "attention", "family_of",
    "fused_activation", "groups_of_equal_length", "layout", "onednn_linear_available", "pack", "probe_rows",
    "unsupported",
]
