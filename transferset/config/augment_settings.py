"""The augment settings: the common ones, then every registered op's, and the nested form per op
(transferset.config imports them back)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import model_validator, with_config

from transferset import augment  # importing it registers every op, whose settings AugmentConfig is made of
from transferset.config.common import _STRICT, LabelNames, Names
from transferset.runtime.registry import RegistryError
from transferset.runtime.typed import AtLeast
from transferset.sources import DEFAULT_LABEL_COLUMN, DEFAULT_MAX_CHARS

# Named op sequences; `AugmentConfig.recipe` picks one unless `ops` is given. The op names are checked
# against the registry by transferset.augment.check_ops, which every augment entry point calls.
RECIPES: dict[str, tuple[str, ...]] = {
    "tang": ("mask", "pos", "ngram"),  # Tang et al. 2019
    "tinybert": ("mlm",),  # Jiao et al. 2020
    "tang_join": ("mask", "pos", "ngram", "join"),  # tang's, and rows of 2-3 originals joined (augment/join.py)
}


@dataclass(frozen=True)
class _AugmentCommon:
    """The augment settings no single op owns; each op's own come from its module (transferset.augment)."""

    # reading
    text_column: Optional[str] = None  # text column of the inputs (None: `sentence`, else `text`)
    label_column: str = DEFAULT_LABEL_COLUMN  # label column of --input files
    text_b_column: Optional[str] = None  # second text column, for sentence pairs
    labels: Optional[LabelNames] = None  # the label set in class order, e.g. neg,pos (None: the first input's labels)
    max_chars: AtLeast(1) = DEFAULT_MAX_CHARS  # reject rows whose text is longer
    limit: Optional[int] = None  # read only the first N rows of each input
    # augmentation
    # tang: mask-or-POS per word, then n-gram (Tang et al. 2019); tinybert: MLM replacement; tang_join: tang's, and
    # rows of 2-3 originals joined (`joins` per original)
    recipe: str = "tang"
    ops: Optional[Names] = None  # compose ops by name instead of a recipe, e.g. mask,ngram (None: the recipe's)
    n_iter: AtLeast(0) = 20  # variants sampled per example (Tang et al.: 20; TinyBERT SST-2: 20)
    unlabeled_n_iter: Optional[AtLeast(0)] = None  # variants per unlabeled example (None: n_iter; 0: the text as is)
    # variants by length: an example of W words gets ceil(W / words_per_variant) variants, at most n_iter
    # (unlabeled_n_iter), at least 1; so long sentences, rare in a set of phrases, get more (None: n_iter each)
    words_per_variant: Optional[AtLeast(1)] = None
    seed: int = 0  # a row depends only on (seed, source id, variant index, settings)


def nested_ops(values: Any) -> Any:
    """The nested form of the augment settings, `ops: {mask: {p: 0.2}, ngram: {max_n: 3}}`, as the flat one
    (`ops: [mask, ngram]`, `p_mask: 0.2`, `max_n: 3`): the ops in that order, each with its own settings
    (`p`: a word op's probability, whatever its field's name). Other values pass as they are."""
    if not isinstance(values, dict) or not isinstance(values.get("ops"), dict):
        return values
    out = {k: v for k, v in values.items() if k != "ops"}
    for name, settings in values["ops"].items():
        try:
            op = augment.get(name)
        except RegistryError as exc:
            raise ValueError(f"ops: {exc}") from None
        if not isinstance(settings, (dict, type(None))):
            raise ValueError(f"ops.{name}: {settings!r} is not a mapping of the op's settings, e.g. "
                             f"{{{name}: {{}}}} for its defaults")
        own = [f.name for f in dataclasses.fields(op.settings)]
        for key, value in (settings or {}).items():
            setting = op.prob if key == "p" and op.prob else key
            if setting not in own:
                raise ValueError(f"ops.{name}.{key}: not a setting of {name}; its settings: "
                                 f"{(['p'] if op.prob else []) + own}")
            if setting in out:
                raise ValueError(f"ops.{name}.{key} and {setting} both set it: keep one")
            out[setting] = value
    out["ops"] = list(values["ops"])
    return out


# Each registered op's settings class (transferset/augment/OP.py) adds its fields after the common
# ones: its defaults and comments are written there once, and become flags, --help and YAML keys here.
_OP_SETTINGS = augment.settings_classes()


@with_config(_STRICT)
@dataclass(frozen=True)
class AugmentConfig(*reversed(_OP_SETTINGS), _AugmentCommon):
    """`transferset augment` and the run's `augment:` section: the common settings, then every op's."""

    # settings no row depends on (left out of to_json and of the run's stage key)
    EXECUTION = tuple(name for cls in _OP_SETTINGS for name in getattr(cls, "EXECUTION", ()))

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, values: Any) -> Any:
        return nested_ops(values)

    def __post_init__(self):
        if self.ops is None:
            if self.recipe not in RECIPES:
                raise ValueError(f"unknown recipe {self.recipe!r}; known: {', '.join(sorted(RECIPES))}")
            object.__setattr__(self, "ops", tuple(RECIPES[self.recipe]))
        for cls in _OP_SETTINGS:  # each op checks its own settings
            if "__post_init__" in vars(cls):
                cls.__post_init__(self)

    def variants_for(self, labeled: bool, words: Optional[int] = None) -> int:
        """How many variants an example gets: unlabeled text may have its own number; with words_per_variant,
        an example of `words` words gets one per that many words, up to that number (at least one)."""
        most = self.n_iter if labeled or self.unlabeled_n_iter is None else self.unlabeled_n_iter
        if self.words_per_variant is None or words is None or most == 0:
            return most
        return min(most, max(1, -(-words // self.words_per_variant)))

    @property
    def makes_variants(self) -> bool:
        return self.variants_for(True) > 0 or self.variants_for(False) > 0

    COLUMNS = ("text_column", "label_column", "text_b_column")

    def column_kwargs(self) -> dict:
        """The input files' columns, as write_eval_set and evaluate take them: the run's dev and test files
        are read with the columns of its train file."""
        return {k: getattr(self, k) for k in self.COLUMNS}

    def to_json(self) -> str:
        """The settings a transfer set depends on (recorded in its Parquet metadata)."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.EXECUTION}
        return json.dumps(values, sort_keys=True)
