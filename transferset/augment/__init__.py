"""Augmenters (one module per op), their registry, context, seeding and composition into recipes.

Importing the package registers every op: each module of this package that is not part of the
machinery below, then every module named by the `transferset.augmenters` entry point group (a
user's own ops, from an installed package). An op module registers its function, settings and
context (see registry and context); adding an op is adding such a module. `check_ops` refuses a
configuration naming an unknown op.
"""
import importlib
import importlib.metadata
import pkgutil

from transferset.augment.compose import (Row, Variant, check_ops, generate, needs, original_row, sequence_ops, split_words,
                                         variant_rows, word_ops)
from transferset.augment.registry import get, names, register, settings_classes

MACHINERY = ("compose", "context", "dedup", "registry", "seeding")  # modules of this package that are not ops
ENTRY_POINTS = "transferset.augmenters"


def _import_ops() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name not in MACHINERY:
            importlib.import_module(f"{__name__}.{module.name}")
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            entry.load()
        except Exception as exc:  # a broken plugin would otherwise fail every command with a bare traceback
            raise ImportError(f"the augmenter {entry.name} = {entry.value} (entry point group {ENTRY_POINTS} of "
                              f"{entry.dist.name if entry.dist else 'an installed package'}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc


_import_ops()

__all__ = ["Row", "Variant", "check_ops", "generate", "get", "names", "needs", "original_row", "register",
           "sequence_ops", "settings_classes", "split_words", "variant_rows", "word_ops"]
