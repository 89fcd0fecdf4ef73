"""Compose registered augmenters into variants of one example.

Word ops share one uniform draw per word, so they are exclusive per word: with ops
(mask, pos) a word is masked when u < p_mask, POS-replaced when p_mask <= u < p_mask +
p_pos, else kept (Tang et al. 2019). Sequence ops (ngram) then run in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Protocol, Sequence

import numpy as np

from transferset.augment import registry
from transferset.augment.seeding import rng_for, row_id, source_int
from transferset.runtime.errors import ConfigError
from transferset.runtime.registry import RegistryError


class AugmentConfig(Protocol):
    """What composing reads of transferset.config.AugmentConfig, besides each op's own settings (that
    class is composed of the ops' settings, so this package cannot import it)."""

    ops: tuple[str, ...]
    n_iter: int
    seed: int

    def variants_for(self, labeled: bool, words: Optional[int] = None) -> int: ...


@dataclass
class Variant:
    variant: int
    ops: list[str]
    words: list[str]


def check_ops(cfg: AugmentConfig, where: str = "augment") -> None:
    """Refuse op names the registry does not know, and word-op probabilities that sum above 1.

    Every augment entry point (the command, the run config, the pipeline) calls it before any work.
    """
    try:
        ops = [registry.get(name) for name in cfg.ops]
    except RegistryError as exc:
        raise ConfigError(f"{where}: ops: {exc}") from None
    word = [op for op in ops if op.kind == registry.WORD]
    total = sum(getattr(cfg, op.prob) for op in word)
    if total > 1:
        raise ConfigError(f"{where}: word-op probabilities sum to {total} > 1 for ops {tuple(op.name for op in word)}")


def word_ops(cfg: AugmentConfig) -> tuple[str, ...]:
    """The configured ops that rewrite chosen words, in order."""
    return tuple(n for n in cfg.ops if registry.get(n).kind == registry.WORD)


def sequence_ops(cfg: AugmentConfig) -> tuple[str, ...]:
    """The configured ops that transform the whole word list, in order."""
    return tuple(n for n in cfg.ops if registry.get(n).kind == registry.SEQUENCE)


def needs(cfg: AugmentConfig, what: str) -> bool:
    """Whether any configured op reads `what` ("tags", "pos_vocab", "candidates")."""
    return any(what in registry.get(n).needs for n in cfg.ops)


def split_words(text: str) -> list[str]:
    return text.split()


def generate(words: Sequence[str], *, source_id: str, cfg: AugmentConfig,
             context: Optional[Mapping[str, Any]] = None, n_iter: Optional[int] = None) -> Iterator[Variant]:
    """`n_iter` (default `cfg.n_iter`) variants of one example; each depends only on (seed, source_id, index, cfg).

    `context` holds what ops need (transferset.augment.context): tags (per word), pos_vocab, candidates (MLM).
    Ops that changed nothing are left out of a variant's provenance.
    """
    ctx = dict(context or {})
    ops = [registry.get(n) for n in word_ops(cfg)]
    probs = np.cumsum([getattr(cfg, op.prob) for op in ops]) if ops else np.zeros(0)
    seq = [registry.get(n) for n in sequence_ops(cfg)]
    args = {op.name: _arguments(op, cfg, ctx) for op in ops + seq}
    source_key = source_int(source_id)  # hashed once per example, not once per variant
    for v in range(cfg.n_iter if n_iter is None else n_iter):
        rng = rng_for(cfg.seed, source_key, v)
        current = list(words)
        applied: list[str] = []
        if ops:
            u = rng.random(len(current))
            choice = np.searchsorted(probs, u, side="right")  # index of the word op, or len: keep
            for j, op in enumerate(ops):
                positions = np.flatnonzero(choice == j)
                if positions.size == 0:
                    continue
                new = op.fn(words=current, positions=positions, rng=rng, **_ready(op, args[op.name]))
                if new != current:
                    applied.append(op.name)
                    current = new
        for op in seq:
            new = op.fn(words=current, rng=rng, **_ready(op, args[op.name]))
            if new != current:
                applied.append(op.name)
                current = new
        yield Variant(v, applied, current)


_MISSING = object()


def _arguments(op: registry.Augmenter, cfg: AugmentConfig, context: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly the keyword arguments `op.fn` declares: its settings from cfg, its needs from the context."""
    return {a: context.get(a, _MISSING) if a in op.needs else getattr(cfg, a) for a in op.arguments}


def _ready(op: registry.Augmenter, args: dict[str, Any]) -> dict[str, Any]:
    missing = [a for a, v in args.items() if v is _MISSING]
    if missing:
        raise ValueError(f"augmenter {op.name!r} needs context {missing} that nothing computed; a pipeline "
                         f"computes what transferset.augment.context.contexts_for(ops) lists")
    return args


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
    words = split_words(text)
    for var in generate(words, source_id=source_id, cfg=cfg, context=context,
                        n_iter=cfg.variants_for(labeled, len(words))):
        new_text = " ".join(var.words)
        yield Row(row_id(source_id, var.ops, var.variant, new_text, text_b), source_id, new_text, text_b,
                  tuple(var.ops), None, var.variant)
