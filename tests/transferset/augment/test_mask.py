"""transferset/augment/mask.py: the masked fraction matches p_mask; only the drawn positions change."""
import numpy as np

from sst2_words import sentences  # noqa: F401 (fixtures)
from transferset.augment import generate
from transferset.augment.mask import mask
from transferset.augment.seeding import rng_for
from transferset.config import AugmentConfig


def test_mask_fraction_matches_p_mask(sentences):
    cfg = AugmentConfig(ops=("mask",), n_iter=10, p_mask=0.1, seed=3)
    masked = total = 0
    for i, words in enumerate(sentences):
        for v in generate(words, source_id=str(i), cfg=cfg):
            masked += sum(w == "[MASK]" for w in v.words)
            total += len(words)
    frac = masked / total
    # ~80k words: the standard error is ~0.001, so 0.01 is a tight yet safe band.
    assert abs(frac - 0.1) < 0.01, frac


def test_mask_only_touches_given_positions():
    out = mask(words=["a", "b", "c"], positions=np.array([1]), rng=rng_for(0, "x", 0), mask_token="[MASK]")
    assert out == ["a", "[MASK]", "c"]
