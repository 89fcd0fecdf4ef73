"""Augmenters (one module per op), their registry, seeding and composition into recipes."""
from transferset.augment import mask, mlm, ngram, pos  # noqa: F401  (registers the ops)
from transferset.augment.compose import (RECIPES, AugmentConfig, Row, Variant, generate, original_row,
                                         split_words, variant_rows)
from transferset.augment.registry import get, names, register

__all__ = ["RECIPES", "AugmentConfig", "Row", "Variant", "generate", "original_row", "split_words",
           "variant_rows", "get", "names", "register"]
