"""transferset/config/augment_settings.py: the settings nested per op are the flat ones."""
import re

import pytest

from transferset.runtime.errors import ConfigError


def test_augment_settings_nested_per_op_are_the_flat_ones():
    """`ops: {mask: {p: 0.3}, ngram: {max_n: 3}}` is `ops: [mask, ngram]` with p_mask 0.3 and max_n 3: the flat
    form users write today stays, and both give the same config (hence the same key)."""
    from transferset.config import AugmentConfig
    from transferset.runtime import typed

    nested = typed.load(AugmentConfig, {"ops": {"mask": {"p": 0.3}, "ngram": {"max_n": 3}, "pos": None}}, where="x")
    flat = typed.load(AugmentConfig, {"ops": ["mask", "ngram", "pos"], "p_mask": 0.3, "max_n": 3}, where="x")
    assert nested == flat and nested.ops == ("mask", "ngram", "pos") and nested.p_mask == 0.3
    for bad, says in [({"ops": {"maks": {}}}, "ops: unknown augmenter 'maks'; known: join, mask, mlm, ngram, pos"),
                      ({"ops": {"mask": {"q": 1}}}, "ops.mask.q: not a setting of mask; its settings: ['p', 'p_mask'"),
                      ({"ops": {"mask": {"p": 0.2}}, "p_mask": 0.1}, "ops.mask.p and p_mask both set it"),
                      ({"ops": {"mask": {"p": 2.0}}}, "p_mask")]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            typed.load(AugmentConfig, bad, where="cfg.yaml: augment")
