"""Compose registered augmenters into variants of one example.

Word ops share one uniform draw per word, so they are exclusive per word: with ops
(mask, pos) a word is masked when u < p_mask, POS-replaced when p_mask <= u < p_mask +
p_pos, else kept (Tang et al. 2019). Sequence ops (ngram) then run in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from transferset.augment import registry
from transferset.augment.registry import RECIPES  # noqa: F401  (re-exported)
from transferset.augment.seeding import rng_for, row_id, source_int
from transferset.config import AugmentConfig


@dataclass
class Variant:
    variant: int
    ops: list[str]
    words: list[str]


def split_words(text: str) -> list[str]:
    return text.split()


def generate(words: Sequence[str], *, source_id: str, cfg: AugmentConfig,
             context: Optional[Mapping[str, Any]] = None, n_iter: Optional[int] = None) -> Iterator[Variant]:
    """`n_iter` (default `cfg.n_iter`) variants of one example; each depends only on (seed, source_id, index, cfg).

    `context` holds what ops need: tags (per word), pos_vocab, candidates (MLM).
    Ops that changed nothing are left out of a variant's provenance.
    """
    ctx = dict(context or {})
    word_ops = [registry.get(n) for n in cfg.word_ops]
    probs = np.cumsum([getattr(cfg, op.prob) for op in word_ops]) if word_ops else np.zeros(0)
    params = {"p_ng": cfg.p_ng, "max_n": cfg.max_n, "mask_token": cfg.mask_token}
    source_key = source_int(source_id)  # hashed once per example, not once per variant
    for v in range(cfg.n_iter if n_iter is None else n_iter):
        rng = rng_for(cfg.seed, source_key, v)
        current = list(words)
        applied: list[str] = []
        if word_ops:
            u = rng.random(len(current))
            choice = np.searchsorted(probs, u, side="right")  # index of the word op, or len: keep
            for j, op in enumerate(word_ops):
                positions = np.flatnonzero(choice == j)
                if positions.size == 0:
                    continue
                new = op.fn(words=current, positions=positions, rng=rng, **params, **ctx)
                if new != current:
                    applied.append(op.name)
                    current = new
        for name in cfg.sequence_ops:
            new = registry.get(name).fn(words=current, rng=rng, **params, **ctx)
            if new != current:
                applied.append(name)
                current = new
        yield Variant(v, applied, current)


@dataclass(frozen=True)
class Row:
    """One transfer-set row before it is written (see schema.transfer_fields)."""

    id: str
    source_id: str
    text: str
    text_b: Optional[str]
    ops: tuple[str, ...]
    label: Optional[int]
    variant: int = -1  # -1: the original

    @property
    def is_original(self) -> bool:
        return self.variant < 0


def original_row(source_id: str, text: str, text_b: Optional[str], label: Optional[int]) -> Row:
    return Row(row_id(source_id, (), -1, text, text_b), source_id, text, text_b, (), label, -1)


def variant_rows(source_id: str, text: str, text_b: Optional[str], *, cfg: AugmentConfig,
                 context: Optional[Mapping[str, Any]] = None, labeled: bool = True) -> Iterator[Row]:
    """Variant rows of one example: no gold label (the teacher labels them)."""
    for var in generate(split_words(text), source_id=source_id, cfg=cfg, context=context,
                        n_iter=cfg.variants_for(labeled)):
        new_text = " ".join(var.words)
        yield Row(row_id(source_id, var.ops, var.variant, new_text, text_b), source_id, new_text, text_b,
                  tuple(var.ops), None, var.variant)
