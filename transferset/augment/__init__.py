"""Augmenters (one module per op), their registry, seeding and composition into recipes.

Importing the package registers every op; `check_ops` refuses a configuration naming an unknown one.
"""
from transferset.augment import mask, mlm, ngram, pos  # noqa: F401  (importing an op registers it)
from transferset.augment.compose import (Row, Variant, check_ops, generate, needs, original_row, sequence_ops, split_words,
                                         variant_rows, word_ops)
from transferset.augment.registry import get, names, register

__all__ = ["Row", "Variant", "check_ops", "generate", "get", "names", "needs", "original_row", "register",
           "sequence_ops", "split_words", "variant_rows", "word_ops"]
