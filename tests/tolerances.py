"""How far apart two float32 computations of the same numbers may be, from the arithmetic.

The same logits computed through differently composed batches (a row alone or among others, a batch
cut elsewhere by Beam), another thread count, the packed and the padded forward, PyTorch and ONNX
Runtime, are the same sums added in another order: another matmul kernel or blocking for another
shape, another split of a reduction across threads. Each such sum of n terms is off its exact value by
at most γ_n·Σ|terms| ≈ n·u·Σ|terms| (u = 2⁻²⁴, float32's unit roundoff; Higham, Accuracy and Stability
of Numerical Algorithms, §3.1), so two orders differ by at most twice that. Through a network the
errors of its chained reductions add, to first order, each scaled by what follows it; in these tiny
models every block ends in a LayerNorm (or a tanh), so the scale of the terms is that of the output.

    |a - b| <= 2 · n · u · reductions · max(1, max |reference|)

n: the longest reduction (the widest layer input, e.g. a transformer's intermediate width); reductions:
how many are chained from input to output (about 7 a transformer layer: Q/K/V, scores, attention-weighted
values, output projection, two feed-forward matmuls, the LayerNorm statistics; plus pooler and classifier).
This is a worst-case bound, about ten times what reordering gives in practice (a fresh clone's CI saw
1.24e-5 on logits of a 2-layer, 64-wide model, where the bound is 1.3e-4 a unit of logit), and still a
thousand times below what a real defect moves a logit (a wrong mask, a dropped row: 1e-1 and more).
A comparison that must be bit-identical (one computation, the same batches, read back) asserts equality.
"""
from __future__ import annotations

import numpy as np

U32 = 2.0 ** -24  # float32's unit roundoff: half the distance from 1.0 to the next float32

TRANSFORMER_LAYER_REDUCTIONS = 7  # Q/K/V, scores, weights·values, output projection, 2 feed-forward, LayerNorm
HEAD_REDUCTIONS = 2  # pooler (or the first of two dense layers) and classifier


def transformer_reductions(layers: int) -> int:
    """The chained reductions of a `layers`-deep BERT-like classifier, embeddings to logits."""
    return TRANSFORMER_LAYER_REDUCTIONS * layers + HEAD_REDUCTIONS


def reordered(reference, *, terms: int, reductions: int) -> float:
    """The absolute tolerance between two float32 computations of `reference` that sum in another order
    (see the module docstring): 2 · terms · u · reductions · max(1, max |reference|)."""
    scale = max(1.0, float(np.max(np.abs(np.asarray(reference, dtype=np.float64)))))
    return 2.0 * terms * U32 * reductions * scale


def tiny_bert(reference, *, hidden: int = 32, layers: int = 2) -> float:
    """`reordered` for transferset.testing.tiny_classifier's shape (intermediate width 2 × hidden)."""
    return reordered(reference, terms=2 * hidden, reductions=transformer_reductions(layers))


def assert_reordered(actual, desired, *, hidden: int = 32, layers: int = 2) -> None:
    """`actual` equals `desired` up to reordered sums through a tiny BERT-like model (`tiny_bert`'s bound)."""
    desired = np.asarray(desired, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float32), desired, rtol=0,
                               atol=tiny_bert(desired, hidden=hidden, layers=layers))
