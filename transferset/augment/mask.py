"""MASK replacement (Tang et al. 2019): chosen words become the mask token."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from transferset.augment.registry import WORD, register


@register("mask", kind=WORD, prob="p_mask")
def mask(*, words: Sequence[str], positions: np.ndarray, rng: np.random.Generator,
         mask_token: str, **_) -> list[str]:
    out = list(words)
    for i in positions:
        out[int(i)] = mask_token
    return out
