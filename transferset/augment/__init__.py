"""Augmenters (one module per op), their registry, context, seeding and composition into recipes.

Importing the package registers every op (transferset/runtime/registry.py): each module of this package that is
not part of the machinery (registry.MACHINERY), then every module named by the `transferset.augmenters`
entry point group (a user's own ops, from an installed package). An op module registers its function,
settings and context (see registry and context); adding an op is adding such a module. `check_ops` refuses a
configuration naming an unknown op.
"""
from transferset.augment.compose import (Row, Variant, check_ops, generate, needs, original_row, sequence_ops, split_words,
                                         variant_rows, word_ops)
from transferset.augment.registry import MACHINERY, REGISTRY, get, names, register, settings_classes

# Every op registers now: transferset.config composes AugmentConfig of their settings when it is imported.
REGISTRY.discover()

__all__ = ["Row", "Variant", "check_ops", "generate", "get", "names", "needs", "original_row", "register",
           "sequence_ops", "settings_classes", "split_words", "variant_rows", "word_ops"]
