"""N-gram sampling (Tang et al. 2019): with p_ng keep one random n-gram, n uniform in 1..max_n."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from transferset.augment.registry import SEQUENCE, register
from transferset.runtime.typed import AtLeast, Probability


@dataclass(frozen=True)
class NgramSettings:
    p_ng: Probability = 0.25  # per variant: probability of keeping only a random n-gram
    max_n: AtLeast(1) = 5  # n-gram length is uniform in 1..max_n



@register("ngram", kind=SEQUENCE, settings=NgramSettings)
def ngram(*, words: Sequence[str], rng: np.random.Generator, p_ng: float, max_n: int) -> list[str]:
    # Both draws happen on every call, so one op's randomness never shifts another's.
    apply = rng.random() < p_ng
    n = int(rng.integers(1, max_n + 1))
    start_u = rng.random()
    if not apply or not words:
        return list(words)
    n = min(n, len(words))
    start = int(start_u * (len(words) - n + 1))
    return list(words[start:start + n])
