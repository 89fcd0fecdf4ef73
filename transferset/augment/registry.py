"""Augmenters registered by name.

Two kinds: a "word" augmenter rewrites the words at the positions the composer chose
for it (so word ops are exclusive per word, as mask-or-POS in Tang et al. 2019); a
"sequence" augmenter transforms the whole word list (e.g. n-gram sampling).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

WORD = "word"
SEQUENCE = "sequence"

@dataclass(frozen=True)
class Augmenter:
    name: str
    kind: str  # WORD or SEQUENCE
    fn: Callable
    prob: str | None  # config field holding the per-word probability of a WORD op
    needs: tuple[str, ...] = ()  # context the op reads: "tags", "pos_vocab", "candidates"


_REGISTRY: dict[str, Augmenter] = {}


def register(name: str, *, kind: str, prob: str | None = None, needs: tuple[str, ...] = ()):
    if kind not in (WORD, SEQUENCE):
        raise ValueError(f"augmenter {name!r}: kind must be {WORD!r} or {SEQUENCE!r}, not {kind!r}")
    if kind == WORD and prob is None:
        raise ValueError(f"word augmenter {name!r} needs the name of its probability setting")

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"augmenter {name!r} is already registered (by {_REGISTRY[name].fn.__module__})")
        _REGISTRY[name] = Augmenter(name, kind, fn, prob, needs)
        return fn

    return deco


def get(name: str) -> Augmenter:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown augmenter {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)
