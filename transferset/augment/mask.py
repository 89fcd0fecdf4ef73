"""MASK replacement (Tang et al. 2019): chosen words become the mask token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from transferset.augment.registry import WORD, register
from transferset.runtime.typed import Probability


@dataclass(frozen=True)
class MaskSettings:
    p_mask: Probability = 0.1  # per word: probability of [MASK]
    mask_token: str = "[MASK]"  # what the mask op writes



@register("mask", kind=WORD, settings=MaskSettings, prob="p_mask")
def mask(*, words: Sequence[str], positions: np.ndarray, rng: np.random.Generator, mask_token: str) -> list[str]:
    out = list(words)
    for i in positions:
        out[int(i)] = mask_token
    return out
