"""Compose registered augmenters into variants of one example.

Word ops share one uniform draw per word, so they are exclusive per word: with ops
(mask, pos) a word is masked when u < p_mask, POS-replaced when p_mask <= u < p_mask +
p_pos, else kept (Tang et al. 2019). Sequence ops (ngram) then run in order.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from transferset.augment import registry
from transferset.augment.mask import MASK_TOKEN
from transferset.augment.mlm import DEFAULT_TOP_K
from transferset.augment.pos import DEFAULT_SPACY_MODEL
from transferset.augment.seeding import rng_for, row_id, source_int

RECIPES: dict[str, tuple[str, ...]] = {
    "tang": ("mask", "pos", "ngram"),  # Tang et al. 2019
    "tinybert": ("mlm",),  # Jiao et al. 2020
}
DEFAULT_RECIPE = "tang"


@dataclass(frozen=True)
class AugmentConfig:
    recipe: str = DEFAULT_RECIPE
    ops: Optional[tuple[str, ...]] = None  # None: the recipe's ops
    n_iter: int = 20  # variants sampled per example (Tang: 20; TinyBERT SST-2: N = 20)
    seed: int = 0
    p_mask: float = 0.1  # per word → [MASK]
    p_pos: float = 0.1  # per word → same-tag word from the corpus unigram distribution
    p_ng: float = 0.25  # per variant → keep a random n-gram
    max_n: int = 5  # n-gram length uniform in 1..max_n
    p_mlm: float = 0.4  # per eligible word → one of the top-M MLM candidates
    mlm_model: str = "bert-base-uncased"
    mlm_top_k: int = DEFAULT_TOP_K  # M
    mask_token: str = MASK_TOKEN
    spacy_model: str = DEFAULT_SPACY_MODEL

    def __post_init__(self):
        if self.ops is None:
            if self.recipe not in RECIPES:
                raise ValueError(f"unknown recipe {self.recipe!r}; known: {', '.join(sorted(RECIPES))}")
            object.__setattr__(self, "ops", RECIPES[self.recipe])
        for name in self.ops:
            registry.get(name)  # raises with the list of known names
        if self.n_iter < 0:
            raise ValueError(f"n_iter must be >= 0, got {self.n_iter}")
        total = sum(getattr(self, registry.get(n).prob) for n in self.word_ops)
        if total > 1:
            raise ValueError(f"word-op probabilities sum to {total} > 1 for ops {self.word_ops}")

    @property
    def word_ops(self) -> tuple[str, ...]:
        return tuple(n for n in self.ops if registry.get(n).kind == registry.WORD)

    @property
    def sequence_ops(self) -> tuple[str, ...]:
        return tuple(n for n in self.ops if registry.get(n).kind == registry.SEQUENCE)

    def needs(self, what: str) -> bool:
        return any(what in registry.get(n).needs for n in self.ops)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class Variant:
    variant: int
    ops: list[str]
    words: list[str]


def split_words(text: str) -> list[str]:
    return text.split()


def generate(words: Sequence[str], *, source_id: str, cfg: AugmentConfig,
             context: Optional[Mapping[str, Any]] = None) -> Iterator[Variant]:
    """`cfg.n_iter` variants of one example; each depends only on (seed, source_id, index, cfg).

    `context` holds what ops need: tags (per word), pos_vocab, candidates (MLM).
    Ops that changed nothing are left out of a variant's provenance.
    """
    ctx = dict(context or {})
    word_ops = [registry.get(n) for n in cfg.word_ops]
    probs = np.cumsum([getattr(cfg, op.prob) for op in word_ops]) if word_ops else np.zeros(0)
    params = {"p_ng": cfg.p_ng, "max_n": cfg.max_n, "mask_token": cfg.mask_token}
    source_key = source_int(source_id)  # hashed once per example, not once per variant
    for v in range(cfg.n_iter):
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
                 context: Optional[Mapping[str, Any]] = None) -> Iterator[Row]:
    """Variant rows of one example: no gold label (the teacher labels them)."""
    for var in generate(split_words(text), source_id=source_id, cfg=cfg, context=context):
        new_text = " ".join(var.words)
        yield Row(row_id(source_id, var.ops, var.variant, new_text, text_b), source_id, new_text, text_b,
                  tuple(var.ops), None, var.variant)
